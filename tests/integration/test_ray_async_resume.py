"""Async (one-step-off, max_staleness 1) mode resume on Ray workers: the checkpoint holds the next step's prefetched
rollouts, so a run stopped by SIGTERM and resumed equals one that ran straight through."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from shared_helpers import PROMPTS, RAY_WORKERS, TARGET_REWARD, signal_after_step, tiny_args

from grpokit import GRPOTrainer
from grpokit.store import RolloutStore
from grpokit.train.rundir.checkpoint import list_checkpoints

ray = pytest.importorskip("ray", reason="Ray tests need the ray extra: pip install 'grpokit[ray]'")
pytestmark = [pytest.mark.ray, pytest.mark.slow]

COMPARED = ("loss", "policy_loss", "kl", "grad_norm", "reward", "policy_staleness", "completion_logprob_mean")


@pytest.fixture(scope="module", autouse=True)
def local_cluster():
    from grpokit.distributed.ray_rollout import connect

    connect(None, num_cpus=2)
    yield
    ray.shutdown()


def trainer(model_dir: Path, run: Path, **overrides) -> GRPOTrainer:
    settings = dict(max_steps=4, max_completion_length=5, learning_rate=5e-3, beta=0.04, save_steps=0)
    # one worker starts (imports, loads the model) in half the time of two
    ray = RAY_WORKERS | dict(num_rollout_workers=1, async_rollouts=True)
    args = tiny_args(run, **(settings | ray | overrides))
    return GRPOTrainer(str(model_dir), TARGET_REWARD, args=args, train_dataset=PROMPTS)


def metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def rollouts(run: Path) -> list[tuple]:
    with RolloutStore(run / "rollouts.sqlite", readonly=True) as store:
        return [
            (r["step"], r["prompt_index"], r["completion_index"], r["completion"], r["policy_version"])
            for r in store.rollouts()
        ]


def test_async_run_stopped_by_sigterm_and_resumed_equals_a_straight_run(tiny_model_dir, tmp_path):
    straight = tmp_path / "straight"
    trainer(tiny_model_dir, straight).train()

    run = tmp_path / "run"
    first = trainer(tiny_model_dir, run)
    signal_after_step(first, 2, signal.SIGTERM)
    first.train()
    assert first.interrupted_by == signal.SIGTERM and first.step == 2
    assert [p.name for p in list_checkpoints(run)] == ["step-2"]
    queue = torch.load(run / "checkpoints" / "step-2" / "states.pt", weights_only=True)["pending_rollouts"]["queue"]
    # step 3's rollouts, sampled by version 1
    assert [(e["step"], e["rollouts"]["policy_version"], e["rollouts"]["completion_ids"].shape[0]) for e in queue] == [
        (3, 1, 8)
    ]
    assert [r[0] for r in rollouts(run)] == [1] * 8 + [2] * 8  # step 3 is not in the store yet

    trainer(tiny_model_dir, run, resume_from="latest").train()

    # every step's rollouts exactly once, with the version that sampled them (step 1 synchronously)
    rows = rollouts(run)
    keys = [r[:3] for r in rows]
    assert len(keys) == len(set(keys)) == 4 * 8
    assert {r[0]: r[4] for r in rows} == {1: 0, 2: 0, 3: 1, 4: 2}
    assert rows == rollouts(straight)
    ms, mr = metrics(straight), metrics(run)
    assert [m["step"] for m in mr] == [1, 2, 3, 4]
    assert [m["policy_staleness"] for m in mr] == [0, 1, 1, 1]
    for a, b in zip(ms, mr):
        for key in COMPARED:
            assert a[key] == pytest.approx(b[key], abs=1e-6), (a["step"], key)
    wa, wb = load_file(straight / "final" / "model.safetensors"), load_file(run / "final" / "model.safetensors")
    for name in wa:
        torch.testing.assert_close(wa[name], wb[name], atol=1e-6, rtol=0)
