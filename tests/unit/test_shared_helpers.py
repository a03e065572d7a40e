"""The builders the tests share (tests/shared_helpers.py): what their defaults are, so that a change to one is seen
here, not as a changed meaning in the thirty files that build their runs with it."""

from __future__ import annotations

import yaml
from shared_helpers import TARGET_REWARD, WORDS, tiny_args, tiny_run_config, word_prompts

from grpokit import GRPOConfig


def test_tiny_args_is_the_tiny_run_written_out(tmp_path):
    written = GRPOConfig(
        output_dir=str(tmp_path / "run"),
        num_generations=4,
        per_device_train_batch_size=8,
        max_steps=2,
        max_completion_length=4,
        progress_bar=False,
        report_to=["jsonl"],
    )
    built = tiny_args(tmp_path / "run")
    assert built == written and built.given_keys == written.given_keys  # the same keys count as given


def test_tiny_args_batch_follows_the_group_size_unless_given():
    assert tiny_args(num_generations=2).per_device_train_batch_size == 4  # 2 completions x 2 prompts
    assert tiny_args(num_generations=8, prompts_per_step=1).per_device_train_batch_size == 8
    assert tiny_args(num_generations=2, per_device_train_batch_size=8).per_device_train_batch_size == 8
    assert tiny_args().output_dir == GRPOConfig().output_dir  # no run folder named: the config's default


def test_tiny_args_takes_trls_progress_key():
    # the config refuses progress_bar beside disable_tqdm with another value; TRL's key replaces the default
    assert tiny_args(disable_tqdm=False).progress_bar is True
    assert tiny_args(disable_tqdm=True).progress_bar is False


def test_word_prompts():
    assert word_prompts(2, 3) == [{"prompt": "w0 w1 w2", "target": "w7"}, {"prompt": "w1 w2 w3", "target": "w7"}]
    assert word_prompts(1, 2, target=None, chat=True) == [{"prompt": [{"role": "user", "content": "w0 w1"}]}]
    assert len(word_prompts()) == 30 and word_prompts()[29]["prompt"] == " ".join(WORDS[29:34])


def test_tiny_run_config_writes_the_tiny_run_and_merges_sections(tmp_path):
    path = tiny_run_config(tmp_path, tmp_path / "model", max_steps=3, optim={"lr_scheduler_type": "constant"})
    config = yaml.safe_load(path.read_text())
    assert config["optim"] == {
        "learning_rate": 1e-3,
        "per_device_train_batch_size": 8,
        "max_steps": 3,
        "lr_scheduler_type": "constant",
    }
    assert config["rewards"] == [TARGET_REWARD] and config["run"]["output_dir"] == str(tmp_path / "run")
    rows = [yaml.safe_load(line) for line in (tmp_path / "train.jsonl").read_text().splitlines()]
    assert rows == word_prompts(20, 4)
    tiny_run_config(tmp_path, tmp_path / "model", max_steps=1, prompts=[{"prompt": "w1"}])
    assert (tmp_path / "train.jsonl").read_text() == '{"prompt": "w1"}\n'
