"""A storm of `kill -9` on an asynchronous run (max_staleness 2: a background thread samples and scores up to two
steps ahead), each process resuming the last with resume_from=latest; the finished run equals an uninterrupted one
with the same seed, sample for sample and number for number.

Where each kill lands is random (seeded), and the test holds wherever it lands: a checkpoint holds the batches
admitted ahead, and what a batch holds is fixed by (seed, step, the weights' version) when it is admitted, never by
the threads' timing."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from shared_helpers import kill_storm, logged_steps, stored, tiny_run_config

from faults.conftest import cli_env, grpokit

G, PROMPTS_PER_STEP, STEPS, KILLS, SEED = 4, 2, 8, 6, 4321
COMPARED = ("loss", "policy_loss", "kl", "grad_norm", "reward", "policy_staleness", "sampling_is/weight_mean")


def write_config(tmp_path: Path, model_dir: Path, name: str) -> Path:
    return tiny_run_config(
        tmp_path,
        model_dir,
        max_steps=STEPS,
        num_generations=G,
        prompts_per_step=PROMPTS_PER_STEP,
        name=name,
        algo={"off_policy_correction": "decoupled_ppo"},
        optim={"learning_rate": 5e-3, "lr_scheduler_type": "constant"},
        distributed={"max_staleness": 2},
        run={"save_steps": 1, "save_total_limit": 2},
    )


@pytest.mark.slow
def test_kill_storm_on_an_async_run_then_resume_equals_an_uninterrupted_run(tmp_path, tiny_model_dir):
    straight = write_config(tmp_path, tiny_model_dir, "straight")
    done = grpokit("train", straight)
    assert done.returncode == 0, done.stderr[-3000:]

    config = write_config(tmp_path, tiny_model_dir, "run")
    run = tmp_path / "run"
    command = [sys.executable, "-m", "grpokit.cli", "train", str(config), "resume_from=latest"]
    history = kill_storm(command, run, cli_env(), tmp_path, KILLS, SEED, start_timeout=300)

    final = grpokit("train", config, "resume_from=latest")
    assert final.returncode == 0, "\n".join(history) + "\n" + final.stderr[-3000:]
    assert stored(run) == stored(tmp_path / "straight"), "\n".join(history)
    ms, mr = logged_steps(tmp_path / "straight"), logged_steps(run)
    assert [m["step"] for m in mr] == list(range(1, STEPS + 1)), "\n".join(history)
    for a, b in zip(ms, mr, strict=True):
        for key in COMPARED:
            assert a[key] == pytest.approx(b[key], abs=1e-6), (a["step"], key, history)
    wa = load_file(tmp_path / "straight" / "final" / "model.safetensors")
    wb = load_file(run / "final" / "model.safetensors")
    for name in wa:
        torch.testing.assert_close(wa[name], wb[name], atol=1e-6, rtol=0)
