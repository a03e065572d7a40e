"""SIGINT / SIGTERM during generation or during the update: the step finishes, a checkpoint is written,
the store and metrics are flushed, the exit code is 130 / 143, and ``resume_from=latest`` continues.

Also holds the helpers test_crash.py uses: a run config on the tiny model, and the check that a run
folder is consistent (integrity of the store, every step once, every checkpoint loadable)."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from conftest import TARGET_REWARD, WORDS
from safetensors.torch import load_file

from grpokit.cli import main
from grpokit.train.checkpoint import list_checkpoints

G, PROMPTS_PER_STEP = 4, 2


def write_run_config(tmp_path: Path, model_dir: Path, max_steps: int) -> Path:
    """A config on the tiny model that checkpoints every step; the run folder is tmp_path / 'run'."""
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"prompt": " ".join(WORDS[i : i + 4]), "target": "w7"}) + "\n" for i in range(20)))
    config = {
        "model": {"model_name_or_path": str(model_dir)},
        "data": {"train_dataset": str(data)},
        "algo": {"num_generations": G, "beta": 0.04},
        "generation": {"max_completion_length": 4},
        "optim": {"learning_rate": 1e-3, "per_device_train_batch_size": G * PROMPTS_PER_STEP, "max_steps": max_steps},
        "run": {"output_dir": str(tmp_path / "run"), "save_steps": 1, "save_total_limit": 2, "progress_bar": False,
                "report_to": ["jsonl"]},
        "rewards": [TARGET_REWARD],
    }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def subprocess_env() -> dict:
    return dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")


def assert_run_consistent(run: Path, last_step: int) -> None:
    """The store passes SQLite's integrity check and holds steps 1..last_step exactly once with all
    their rollouts; metrics.jsonl has one line per step; every checkpoint folder loads."""
    with sqlite3.connect(run / "rollouts.sqlite") as db:
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert [s for (s,) in db.execute("SELECT step FROM steps ORDER BY step")] == list(range(1, last_step + 1))
        per_step = dict(db.execute("SELECT step, count(*) FROM rollouts GROUP BY step"))
        assert per_step == {s: G * PROMPTS_PER_STEP for s in range(1, last_step + 1)}
    lines = (run / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == list(range(1, last_step + 1))
    for folder in list_checkpoints(run):
        state = json.loads((folder / "trainer_state.json").read_text())
        assert folder.name == f"step-{state['step']}"
        assert load_file(folder / "model.safetensors")
        assert set(torch.load(folder / "states.pt", weights_only=True)) == {"optimizer", "scheduler", "rng"}


# Runs `grpokit train` with a patch that sends the process a signal when the given method is
# called for the second time, i.e. during the second step's generation or update.
DRIVER = """
import os, signal, sys
from grpokit.rollout.engine import HFRolloutEngine
from grpokit.train.learner import Learner

owner, method = {"generate": (HFRolloutEngine, "generate"), "update": (Learner, "update")}[sys.argv[1]]
signum = getattr(signal, sys.argv[2])
real, calls = getattr(owner, method), []

def patched(self, *args, **kwargs):
    calls.append(1)
    if len(calls) == 2:
        os.kill(os.getpid(), signum)
    return real(self, *args, **kwargs)

setattr(owner, method, patched)
from grpokit.cli import main
sys.exit(main(["train", *sys.argv[3:]]))
"""


@pytest.mark.slow
@pytest.mark.parametrize("phase", ["generate", "update"])
@pytest.mark.parametrize("signame, code", [("SIGINT", 130), ("SIGTERM", 143)])
def test_signal_stops_after_the_step_with_a_checkpoint_that_resumes(tmp_path, tiny_model_dir, phase, signame, code):
    config = write_run_config(tmp_path, tiny_model_dir, max_steps=3)
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    proc = subprocess.run([sys.executable, str(driver), phase, signame, str(config)], env=subprocess_env(),
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == code, proc.stderr
    assert f"received {signame}" in proc.stderr
    run = tmp_path / "run"
    # the step in progress (2) was finished, saved and flushed; nothing after it
    assert list_checkpoints(run)[-1].name == "step-2"
    assert_run_consistent(run, last_step=2)

    assert main(["train", str(config), "resume_from=latest"]) == 0
    assert_run_consistent(run, last_step=3)
    assert [p.name for p in list_checkpoints(run)] == ["step-2", "step-3"]
    assert (run / "final" / "model.safetensors").exists()


def test_signal_handlers_are_restored_after_an_error(tmp_path, tiny_model_dir, monkeypatch):
    """A step that raises must not leave the trainer's handlers installed in the caller's process."""
    from grpokit.train.learner import Learner

    def broken_update(self, *args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(Learner, "update", broken_update)
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    config = write_run_config(tmp_path, tiny_model_dir, max_steps=2)
    with pytest.raises(RuntimeError, match="boom"):
        main(["train", str(config)])
    assert {s: signal.getsignal(s) for s in before} == before
