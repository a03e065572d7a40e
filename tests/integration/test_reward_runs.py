"""Reward functions in whole runs on the tiny model: TRL's keywords, log_metric / log_extra reaching
metrics.jsonl and the store, loud failures, and rewards that hang holding the GIL."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from shared_helpers import REWARD_FILE, TARGET_REWARD, tiny_args, tiny_run_config, word_prompts

from grpokit import GRPOTrainer
from grpokit.cli import main
from grpokit.store import RolloutStore
from grpokit.store.inspect import inspect_run


def chat_prompts() -> list[dict]:
    return word_prompts(8, 3, chat=True)


def test_keywords_log_metric_and_log_extra_in_a_conversational_run(tmp_path, tiny_model_dir):
    trainer = GRPOTrainer(
        str(tiny_model_dir), f"{REWARD_FILE}:recording", args=tiny_args(tmp_path / "run"), train_dataset=chat_prompts()
    )
    trainer.train()
    run = tmp_path / "run"
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["recording/global_step"] for m in metrics] == [0.0, 1.0]  # trainer_state before each step's update
    assert [m["rewards/recording/errors"] for m in metrics] == [0.0, 0.0]
    with RolloutStore(run, readonly=True) as store:
        rollouts = store.rollouts()
    assert len(rollouts) == 16
    for r in rollouts:  # completion_ids were this completion's tokens, aligned with the stored rows
        assert r["extra"] == {"n_ids": r["completion_tokens"], "state": f"{r['step'] - 1}/2"}
        assert r["prompt"].startswith("user : ")  # the store keeps the readable (templated) text
    assert "n_ids: " in inspect_run(run, step=1)


def write_config(tmp_path: Path, model_dir: Path, rewards: list, **reward_settings) -> Path:
    return tiny_run_config(
        tmp_path, model_dir, max_steps=2, rewards=rewards, algo={"beta": 0.0}, reward=reward_settings
    )


def test_a_reward_that_always_raises_stops_the_run_at_step_1(tmp_path, tiny_model_dir, capsys):
    config = write_config(tmp_path, tiny_model_dir, [f"{REWARD_FILE}:always_raises"])
    assert main(["train", str(config)]) == 2
    err = capsys.readouterr().err
    assert "grpokit: error: every reward function failed on every completion of the first batch" in err
    assert "ValueError: this reward is broken" in err and err.count("Traceback (most recent call last)") == 1
    assert not (tmp_path / "run" / "metrics.jsonl").exists() or not (tmp_path / "run" / "metrics.jsonl").read_text()


def test_a_reward_that_raises_on_one_batch_continues_and_its_error_is_printed_once_and_stored(
    tmp_path, tiny_model_dir, capsys
):
    config = write_config(tmp_path, tiny_model_dir, [f"{REWARD_FILE}:raises_at_step_3", TARGET_REWARD])
    assert main(["train", str(config), "max_steps=4"]) == 0
    err = capsys.readouterr().err
    assert err.count("reward 'raises_at_step_3' failed: RuntimeError: flaky judge at step 3") == 1
    with RolloutStore(tmp_path / "run", readonly=True) as store:
        errors = {r["step"]: r["error"] for r in store.rollouts()}
    assert errors == {1: None, 2: None, 3: "raises_at_step_3: RuntimeError: flaky judge at step 3", 4: None}


def test_a_gil_holding_reward_is_cut_at_its_timeout_and_the_run_completes(tmp_path, tiny_model_dir, capsys):
    config = write_config(tmp_path, tiny_model_dir, [f"{REWARD_FILE}:gil_hog", TARGET_REWARD])
    # TARGET_REWARD, in its own worker, must answer within the timeout on a loaded machine too: 5 s
    assert main(["train", str(config), "reward_timeout=5", "eval_steps=0"]) == 0
    assert "reward 'gil_hog' failed: timed out after 5 s" in capsys.readouterr().err
    with RolloutStore(tmp_path / "run", readonly=True) as store:
        rollouts = store.rollouts()
    assert sorted({r["step"] for r in rollouts}) == [1, 2]
    assert all(
        r["error"].startswith("gil_hog: timed out after 5 s") and r["rewards"]["gil_hog"] is None for r in rollouts
    )


def test_sigterm_while_a_reward_holds_the_gil_ends_the_run_cleanly(tmp_path, tiny_model_dir):
    pid_file = tmp_path / "worker.pid"
    hog = {"name": f"{REWARD_FILE}:gil_hog", "pid_file": str(pid_file)}
    config = write_config(tmp_path, tiny_model_dir, [hog, TARGET_REWARD], reward_timeout=3)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path), HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    proc = subprocess.Popen(
        [sys.executable, "-m", "grpokit.cli", "train", str(config), "max_steps=50"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        for _ in range(1200):  # up to two minutes for the model to load and the first step to sample
            if (pid_file.exists() and pid_file.read_text()) or proc.poll() is not None:
                break
            time.sleep(0.1)
        worker = int(pid_file.read_text())
        proc.send_signal(signal.SIGTERM)
        _out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, err
    assert "Traceback" not in err and "concurrent.futures" not in err
    assert not _alive(worker)  # the worker holding the GIL was killed, not left behind


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except FileNotFoundError:
        return False
    return state not in ("Z", "X")


def _shape(kwargs: dict) -> dict:
    """What a reward function can tell about its keywords: names, element types, alignment."""
    n = len(kwargs["completions"])
    return {
        "names": sorted(k for k in kwargs if k != "global_step_then"),
        "prompt": type(kwargs["prompts"][0]).__name__,
        "completion": [sorted(m) for m in kwargs["completions"][0]],
        "completion_role": kwargs["completions"][0][0]["role"],
        "ids": (type(kwargs["completion_ids"][0]).__name__, type(kwargs["completion_ids"][0][0]).__name__),
        "state": [hasattr(kwargs["trainer_state"], k) for k in ("global_step", "max_steps", "epoch")],
        "global_step": kwargs["global_step_then"],
        "callables": [callable(kwargs["log_metric"]), callable(kwargs["log_extra"])],
        "aligned": [len(kwargs[k]) == n for k in ("prompts", "completion_ids", "target")],
    }


@pytest.mark.slow
def test_the_same_keywords_types_and_alignment_as_trl(tmp_path, tiny_model_dir):
    pytest.importorskip("trl")
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import GRPOConfig as TRLConfig
    from trl import GRPOTrainer as TRLTrainer

    calls = {"trl": [], "grpokit": []}

    def recorder(name):
        def recording(**kwargs):
            # TRL passes its live TrainerState: read the step now, not after training
            calls[name].append({**kwargs, "global_step_then": kwargs["trainer_state"].global_step})
            return [0.0] * len(kwargs["completions"])

        return recording

    rows = chat_prompts()[:4]
    trl_args = TRLConfig(
        output_dir=str(tmp_path / "trl"),
        use_cpu=True,
        bf16=False,
        per_device_train_batch_size=4,
        num_generations=2,
        max_completion_length=4,
        max_steps=1,
        report_to="none",
        disable_tqdm=True,
        save_strategy="no",
        logging_steps=1,
    )
    TRLTrainer(
        model=str(tiny_model_dir),
        reward_funcs=recorder("trl"),
        args=trl_args,
        train_dataset=Dataset.from_list(rows),
        processing_class=AutoTokenizer.from_pretrained(tiny_model_dir),
    ).train()
    GRPOTrainer(
        str(tiny_model_dir),
        recorder("grpokit"),
        args=tiny_args(tmp_path / "run", num_generations=2, max_steps=1, reward_isolation=False),
        train_dataset=rows,
    ).train()
    theirs, ours = _shape(calls["trl"][0]), _shape(calls["grpokit"][0])
    assert set(ours.pop("names")) - set(theirs.pop("names")) == {"completion_lengths"}  # grpokit adds token counts
    assert ours == theirs


def test_a_reward_model_folder_in_the_config_rewards(tmp_path, tiny_model_dir):
    """`rewards:` takes a reward model's folder as reward_funcs does: TRL's AutoModelForSequenceClassification with
    one output, named after the folder, each completion's reward logits[:, 0] of prompt + completion (its own
    tokenizer, right padding, no special tokens added), weighted like any reward."""
    import torch
    from transformers import AutoTokenizer

    from grpokit.testing import build_tiny_reward_model

    folder = tmp_path / "models" / "word-judge"
    model, tokenizer = build_tiny_reward_model(folder, AutoTokenizer.from_pretrained(tiny_model_dir))
    config = write_config(tmp_path, tiny_model_dir, [{"name": str(folder), "weight": 2.0}, TARGET_REWARD])
    assert main(["train", str(config), "max_steps=1"]) == 0
    with RolloutStore(tmp_path / "run", readonly=True) as store:
        rows = store.rollouts(step=1)
    texts = [row["prompt"] + row["completion"] for row in rows]
    inputs = tokenizer(text=texts, return_tensors="pt", padding=True, padding_side="right", add_special_tokens=False)
    with torch.no_grad():
        expected = model(**inputs).logits[:, 0]
    got = torch.tensor([row["rewards"]["word-judge"] for row in rows])
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
    combined = torch.tensor([row["reward"] for row in rows])
    target = torch.tensor([row["rewards"]["target_fraction"] for row in rows])
    torch.testing.assert_close(combined, 2.0 * expected + target, atol=1e-4, rtol=1e-4)
