"""Async training with vLLM in a Ray rollout worker (max_staleness 2, decoupled PPO) and partial rollouts
(vllm_partial_rollout_tokens 4) on the real vLLM CPU build, killed with `kill -9` at random moments and resumed with
resume_from=latest each time: the finished run equals one that never stopped, sample for sample (token versions
included) and number for number (as tests/faults/test_async_kills.py with grpokit's engine).
One worker: every start builds its engine, and each kill costs a start on a 2-core machine. Every step's batch is
up to 2 versions old; a completion longer than 4 tokens continues on the next version from its 5th token
(grpokit/rollout/partial.py). The worker's vLLM matches its copy of the sampling version to GAP_FP32 on each
piece: the first 4 tokens against the admitted version, the rest against the next (rollout_worker_sync_gap_max,
rollout_worker_sync_gap_continued_max); the learner-side gap (sampling_is/logprob_abs_diff) measures the staleness
there."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from real_vllm_helpers import GAP_FP32, SETTINGS, TARGET_REWARD, check_token_versions, prompts
from safetensors.torch import load_file
from shared_helpers import kill_storm, logged_steps, stored

pytest.importorskip("ray", reason="the vLLM environment has no ray: make test-vllm installs grpokit[ray] there")

STEPS, KILLS, SEED, K = 6, 2, 4321, 2
S = 4  # vllm_partial_rollout_tokens: tokens 0-3 by the admitted version, the rest by the next (max length 8)
COMPARED = (
    "loss",
    "policy_loss",
    "kl",
    "grad_norm",
    "reward",
    "policy_staleness",
    "policy_staleness_token_mean",
    "sampling_is/weight_mean",
)


def write_config(tmp_path: Path, model_dir: Path, name: str) -> Path:
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in prompts()))
    values = {
        **SETTINGS,
        "model_name_or_path": str(model_dir),
        "train_dataset": str(data),
        "output_dir": str(tmp_path / name),
        "dtype": "float32",
        "max_steps": STEPS,
        "lr_scheduler_type": "constant",
        "save_steps": 1,
        "backend": "ray",
        "num_rollout_workers": 1,
        "rollout_worker_cpus": 1,
        "ray_num_cpus": 2,
        "max_staleness": K,
        "off_policy_correction": "decoupled_ppo",
        "vllm_partial_rollout_tokens": S,
        "rewards": [TARGET_REWARD],
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(values))
    return path


def env() -> dict:
    found = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    found.pop("VLLM_CPU_KVCACHE_SPACE", None)  # the worker's engine takes vllm_kv_cache_gib (0.25)
    return found


def train(config: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "grpokit.cli", "train", str(config), *extra],
        env=env(),
        capture_output=True,
        text=True,
        timeout=900,  # a Ray start and a vLLM start on a shared 2-core machine: ~1 min; a hang ends here
        check=False,
    )


def test_kill_9_on_an_async_vllm_run_then_resume_equals_an_uninterrupted_run(tmp_path, vllm_model_dir):
    done = train(write_config(tmp_path, vllm_model_dir, "straight"))
    assert done.returncode == 0, done.stderr[-6000:]
    straight = logged_steps(tmp_path / "straight")
    assert [m["policy_staleness"] for m in straight] == [min(s - 1, K) for s in range(1, STEPS + 1)]
    for line in straight:
        assert line["rollout_worker_sync_gap_max"] <= GAP_FP32, line  # every piece, against its own version
    continued = [line["rollout_worker_sync_gap_continued_max"] for line in straight[1:]]
    assert max(continued) <= GAP_FP32, continued  # the pieces from token S on, against the next version
    check_token_versions(tmp_path / "straight", straight, K, S)

    config, run = write_config(tmp_path, vllm_model_dir, "run"), tmp_path / "run"
    command = [sys.executable, "-m", "grpokit.cli", "train", str(config), "resume_from=latest"]
    history = kill_storm(command, run, env(), tmp_path, KILLS, SEED, start_timeout=600)  # Ray and vLLM start slowly

    final = train(config, "resume_from=latest")
    assert final.returncode == 0, "\n".join(history) + "\n" + final.stderr[-6000:]
    assert stored(run) == stored(tmp_path / "straight"), "\n".join(history)
    resumed = logged_steps(run)
    assert [m["step"] for m in resumed] == list(range(1, STEPS + 1)), "\n".join(history)
    for a, b in zip(straight, resumed, strict=True):
        for key in COMPARED:
            assert a[key] == pytest.approx(b[key], abs=1e-6), (a["step"], key, history)
    wa = load_file(tmp_path / "straight" / "final" / "model.safetensors")
    wb = load_file(run / "final" / "model.safetensors")
    for name in wa:
        torch.testing.assert_close(wa[name], wb[name], atol=1e-6, rtol=0)
