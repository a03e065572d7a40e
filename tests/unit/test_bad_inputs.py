"""Malformed configs and datasets fail fast: exit code 2, one message on stderr, no model loaded.

The corpus lives in tests/data/bad_inputs/ (manifest.yaml maps each case to its message).
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
import yaml
from shared_helpers import cli_env, grpokit_cli

from grpokit.cli import main
from grpokit.compose import policy as setup
from grpokit.config import ConfigError, GRPOConfig, load_config, parse_overrides
from grpokit.data.prompts import (
    DataError,
    PromptSource,
    check_reward_columns,
    reward_columns,
)
from grpokit.testing import build_word_tokenizer

BAD = Path(__file__).resolve().parents[1] / "data" / "bad_inputs"
MANIFEST = yaml.safe_load((BAD / "manifest.yaml").read_text())
# config files used by the cases but not cases themselves
HELPERS = {"valid.yaml", "other_run.yaml", "manifest.yaml", "run_folders.yaml"}


@pytest.fixture()
def in_corpus(monkeypatch):
    """Run from the corpus folder (its configs use relative paths), with its reward module importable,
    and record every attempt to load a model."""
    monkeypatch.chdir(BAD)
    monkeypatch.syspath_prepend(str(BAD))
    loads: list[str] = []
    real = setup.load_model

    def recording_load_model(name, *args, **kwargs):
        loads.append(name)
        return real(name, *args, **kwargs)

    monkeypatch.setattr(setup, "load_model", recording_load_model)
    return loads


def test_corpus_is_large_and_every_file_is_a_case():
    assert len(MANIFEST) >= 30
    used = {case["config"] for case in MANIFEST.values()} | {case.get("existing_run") for case in MANIFEST.values()}
    orphans = {p.name for p in BAD.glob("*.yaml")} - used - HELPERS
    assert not orphans, f"corpus files with no manifest entry: {orphans}"


@pytest.mark.parametrize("name", list(MANIFEST))
def test_bad_input_fails_fast_with_its_message(name, in_corpus, tmp_path, capsys):
    case = MANIFEST[name]
    run = tmp_path / "run"
    if "existing_run" in case:
        run.mkdir()
        (run / "config.yaml").write_text(load_config(case["existing_run"], [f"output_dir={run}"]).to_yaml())
    code = main(["train", case["config"], *case.get("overrides", []), f"output_dir={run}"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith("grpokit: error: ") and err.count("grpokit: error:") == 1
    assert case["expect"] in err, err
    assert in_corpus == (["./no-such-model"] if case.get("loads_model") else [])


@pytest.mark.parametrize("name", ["wrong_type_float", "reward_column_missing"])
def test_bad_input_through_the_installed_command(name, tmp_path):
    """The real entry point: exit status 2, the message on stderr, no traceback."""
    case = MANIFEST[name]
    proc = grpokit_cli(
        "train", case["config"], f"output_dir={tmp_path / 'run'}", env=cli_env(BAD), cwd=BAD, timeout=120
    )
    assert proc.returncode == 2, proc.stderr
    assert case["expect"] in proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""


# ---- the run folder guard ------------------------------------------------------------------------
@pytest.mark.parametrize("escape", [["--overwrite"], ["overwrite=true"], ["resume_from=latest"]])
def test_overwrite_or_resume_passes_the_run_folder_guard(escape, in_corpus, tmp_path, capsys):
    """With --overwrite or a resume the guard lets the run through; it then stops at the (missing) model."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(load_config("other_run.yaml", [f"output_dir={run}"]).to_yaml())
    assert main(["train", "valid.yaml", f"output_dir={run}", *escape]) == 2
    assert "model path './no-such-model' does not exist" in capsys.readouterr().err


def test_same_config_in_the_run_folder_is_refused_too(in_corpus, tmp_path, capsys):
    """Starting over would wipe the earlier run, so even an identical config needs resume or overwrite."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(load_config("valid.yaml", [f"output_dir={run}"]).to_yaml())
    assert main(["train", "valid.yaml", f"output_dir={run}"]) == 2
    err = capsys.readouterr().err
    assert "already holds a run;" in err and "resume_from: latest" in err


# ---- override parsing ----------------------------------------------------------------------------
def test_bare_flag_is_true_and_flag_value_pairs_still_work():
    assert parse_overrides(["--overwrite"]) == {"overwrite": True}
    assert parse_overrides(["--overwrite", "max_steps=3"]) == {"overwrite": True, "max_steps": 3}
    assert parse_overrides(["--max_steps", "3", "--overwrite"]) == {"max_steps": 3, "overwrite": True}


# ---- reward columns ------------------------------------------------------------------------------
def test_reward_columns_from_signature_attribute_and_partial():
    def exact(prompts, completions, answer, **columns):
        return [0.0] * len(completions)

    def weighted(prompts, completions, answer, scale=1.0, *, source, **columns):
        return [0.0] * len(completions)

    class Declared:
        required_columns = ("solution",)

        def __call__(self, prompts, completions, **columns):
            return [0.0] * len(completions)

    assert reward_columns(exact) == ["answer"]
    assert reward_columns(weighted) == ["answer", "source"]  # scale has a default
    assert reward_columns(functools.partial(weighted, source="x")) == ["answer"]  # bound by the spec's params
    assert reward_columns(Declared()) == ["solution"]
    assert reward_columns(lambda prompts, completions, **kw: []) == []


def test_check_reward_columns_names_reward_column_and_row():
    def exact(prompts, completions, answer, **columns):
        return []

    def by_length(prompts, completions, completion_lengths, **columns):
        return []

    rows = [{"prompt": "a", "answer": "1"}, {"prompt": "b", "hint": "x"}]
    check_reward_columns(
        rows[:1], {"exact": exact, "by_length": by_length}
    )  # completion_lengths comes from the trainer
    with pytest.raises(
        DataError,
        match=r"reward 'exact' needs the column 'answer', but train_dataset row 1 has none "
        r"\(its other columns: 'hint'\)",
    ):
        check_reward_columns(rows, {"exact": exact})


# ---- prompts longer than max_prompt_length ----------------------------------------------------------
@pytest.fixture(scope="module")
def tokenizer():
    return build_word_tokenizer([f"w{i}" for i in range(10)])


def long_and_short_rows():
    # token counts (word tokenizer, no special tokens added by it): 2, 6, 3, 5
    return [{"prompt": "w1 w2"}, {"prompt": "w0 w1 w2 w3 w4 w5"}, {"prompt": "w7 w8 w9"}, {"prompt": "w1 w2 w3 w4 w5"}]


def test_long_prompts_are_truncated_from_the_left_and_counted(tokenizer):
    source = PromptSource(long_and_short_rows(), tokenizer, max_prompt_length=4, overflow="truncate", shuffle=False)
    assert source.num_truncated == 2 and source.num_dropped == 0
    # the end of a prompt holds the question, so its last 4 tokens are kept
    assert tokenizer.decode(source.ids[1]) == "w2 w3 w4 w5"
    assert sorted(source.next_indices(4)) == [0, 1, 2, 3]
    assert source.longest == 4  # what the memory estimate sizes the update for


def test_long_prompts_are_dropped_and_counted(tokenizer):
    source = PromptSource(long_and_short_rows(), tokenizer, max_prompt_length=4, overflow="drop", shuffle=False)
    assert source.num_dropped == 2 and source.num_truncated == 0
    assert source.next_indices(2) == [0, 2] and source.next_indices(2) == [0, 2]  # only the two short prompts are drawn
    assert source.longest == 3  # the dropped prompts (6 and 5 tokens) are never sampled


def test_long_prompt_error_mode_and_all_dropped(tokenizer):
    with pytest.raises(DataError, match="prompt 1 has 6 tokens, more than max_prompt_length=4"):
        PromptSource(long_and_short_rows(), tokenizer, max_prompt_length=4, overflow="error")
    with pytest.raises(DataError, match="every prompt is longer than max_prompt_length=1"):
        PromptSource(long_and_short_rows(), tokenizer, max_prompt_length=1, overflow="drop")


# ---- the Python API rejects the same inputs ------------------------------------------------------------
def test_python_api_rejects_bad_config_values():
    with pytest.raises(ConfigError, match="Did you mean 'num_generations'"):
        GRPOConfig(num_generation=4)
    with pytest.raises(ConfigError, match="is not divisible by num_generations"):
        GRPOConfig(num_generations=3, per_device_train_batch_size=8)
    cfg = GRPOConfig()
    with pytest.raises(ConfigError, match="unknown config key 'lr'"):
        cfg.lr = 1e-5
