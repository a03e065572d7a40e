"""The CLI on missing, foreign and half-written run folders and on a checkpoint of another model: exit 2,
one line `grpokit: error: ...`, and the run folder left byte for byte as it was.

The cases are in tests/data/bad_inputs/run_folders.yaml; each runs against a copy of one finished tiny run.
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest
import yaml
from shared_helpers import WORDS, cli_env, grpokit_cli, tiny_run_config, word_prompts

from grpokit.cli import main
from grpokit.testing import build_tiny_causal_lm, build_word_tokenizer

BAD = Path(__file__).resolve().parents[1] / "data" / "bad_inputs"
CASES = yaml.safe_load((BAD / "run_folders.yaml").read_text())


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory, tiny_model_dir):
    """A finished 2-step run (checkpoints step-1 and step-2, final/) and a tiny model of another size."""
    root = tmp_path_factory.mktemp("finished")
    config = tiny_run_config(
        root,
        tiny_model_dir,
        max_steps=2,
        prompts=word_prompts(12, 4),
        data={"eval_dataset": str(root / "train.jsonl")},
        algo={"beta": 0.0},
        generation={"max_completion_length": 3},
        run={"save_steps": 1},
        eval={"eval_steps": 0},
    )
    assert main(["train", str(config)]) == 0
    other = root / "model2"
    build_tiny_causal_lm(
        other,
        build_word_tokenizer([*WORDS, "user", "assistant", "system", ":"]),
        arch="llama",
        hidden_size=16,
        num_layers=1,
        num_heads=2,
    )
    return root / "run", other


def damage(run: Path, kind: str | None) -> None:
    if kind == "foreign":
        shutil.rmtree(run)
        run.mkdir()
        (run / "notes.txt").write_text("not a run\n")
    elif kind == "file":
        shutil.rmtree(run)
        run.write_text("a regular file\n")
    elif kind == "no_config":
        (run / "config.yaml").unlink()
    elif kind == "torn_config":
        (run / "config.yaml").write_text("model: [\n")
    elif kind == "no_final":
        shutil.rmtree(run / "final")
    elif kind == "empty_final":
        shutil.rmtree(run / "final")
        (run / "final").mkdir()
    elif kind == "garbage_store":
        (run / "rollouts.sqlite").write_text("not a database\n")
    else:
        assert kind is None, kind


def snapshot(path: Path) -> dict[str, str]:
    """Every file under ``path`` (or ``path`` itself) with a hash of its bytes; the run folder's lock file left out
    (a refused `train` that took the lock names itself there as the folder's last writer)."""
    files = (
        [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file() and p.name != ".grpokit.lock")
    )
    return {str(p.relative_to(path.parent)): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


@pytest.mark.parametrize("name", list(CASES))
def test_run_folder_case_fails_with_its_message_and_changes_nothing(name, finished_run, tmp_path, capsys, monkeypatch):
    case = CASES[name]
    source, model2 = finished_run
    monkeypatch.syspath_prepend(str(BAD))  # bad_input_rewards
    run, scratch = tmp_path / "run", tmp_path / "scratch"
    scratch.mkdir()
    shutil.copytree(source, run)
    shutil.copy(run / "config.yaml", scratch / "config.yaml")
    damage(run, case.get("damage"))
    before = snapshot(run)
    values = {"run": run, "tmp": scratch, "model2": model2}
    code = main([arg.format(**values) for arg in case["args"]])
    err = capsys.readouterr().err
    assert code == 2, err
    last = err.splitlines()[-1]  # before it, at most the model loader's progress bars
    assert last.startswith("grpokit: error: ") and err.count("grpokit: error:") == 1, err
    assert case["expect"] in last, err
    assert snapshot(run) == before
    if "absent" in case:
        assert not Path(case["absent"].format(**values)).exists()


def test_report_of_a_half_written_run_skips_the_torn_metrics_line(finished_run, tmp_path, capsys):
    """No store (a run killed before its first step was written) and a metrics.jsonl whose last line was torn."""
    run = tmp_path / "run"
    shutil.copytree(finished_run[0], run)
    for name in ("rollouts.sqlite", "final", "checkpoints"):
        shutil.rmtree(run / name) if (run / name).is_dir() else (run / name).unlink()
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"step": 3, "rew')
    assert main(["report", str(run)]) == 0
    assert "Reward" in (run / "report.html").read_text()


def test_reward_error_through_the_installed_command(finished_run, tmp_path):
    """The issue's case on the real entry point: a reward returning one value is one line and exit 2."""
    overrides = [f"output_dir={tmp_path / 'new'}", "rewards=[bad_input_rewards:one_value]"]
    proc = grpokit_cli("train", finished_run[0] / "config.yaml", *overrides, env=cli_env(BAD), timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert [line for line in proc.stderr.splitlines() if "error" in line] == [
        "grpokit: error: reward 'one_value' returned 1 values for 8 completions: [0.0]"
    ]
