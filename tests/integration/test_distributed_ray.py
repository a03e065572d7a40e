"""torchrun and Ray together: rank 0 drives the Ray rollout workers for the global batch and
scatters each rank's share; the ranks train with DDP or FSDP (gloo)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml
from shared_helpers import TARGET_REWARD
from test_distributed import read_metrics, torchrun, write_config

from grpokit.cli import main
from grpokit.store import RolloutStore

pytest.importorskip("ray", reason="Ray tests need the ray extra: pip install 'grpokit[ray]'")
pytestmark = [pytest.mark.ray, pytest.mark.slow]

RAY = {"backend": "ray", "num_rollout_workers": 2, "rollout_worker_cpus": 0.5, "ray_num_cpus": 2}


def with_ray(config: Path, **extra) -> Path:
    data = yaml.safe_load(config.read_text())
    data["distributed"].update(RAY, **extra)
    config.write_text(yaml.safe_dump(data))
    return config


def rollouts_of(run: Path) -> list[dict]:
    with RolloutStore(run / "rollouts.sqlite", readonly=True) as store:
        return store.rollouts()


def key(r: dict) -> tuple:
    return r["step"], r["prompt_index"], r["completion_index"]


def test_two_gloo_processes_with_ray_workers_match_one_process(tmp_path, tiny_model_dir, word_prompts):
    # Same global batch: 1 process x 4 per micro-batch x 2 accumulation = 2 processes x 4 x 1 = 8 completions.
    one = write_config(
        tmp_path, tiny_model_dir, word_prompts, "one", per_device_train_batch_size=4, gradient_accumulation_steps=2
    )
    two = with_ray(
        write_config(
            tmp_path, tiny_model_dir, word_prompts, "two", per_device_train_batch_size=4, gradient_accumulation_steps=1
        )
    )
    torchrun(two)
    assert main(["train", str(one)]) == 0  # one process, no Ray, seed_per_group

    m1, m2 = read_metrics(tmp_path / "one"), read_metrics(tmp_path / "two")
    assert [m["step"] for m in m2] == [1, 2, 3]
    for a, b in zip(m1, m2):
        assert a["reward"] == pytest.approx(b["reward"], abs=1e-6)  # identical rollouts
        assert a["loss"] == pytest.approx(b["loss"], abs=1e-5)
        assert a["kl"] == pytest.approx(b["kl"], abs=1e-5)
        assert b["rollout_worker_restarts"] == 0 and b["policy_staleness"] == 0
    assert all(m["advantage/std"] > 0 for m in m1)  # every step trains on non-zero advantages
    r1, r2 = rollouts_of(tmp_path / "one"), rollouts_of(tmp_path / "two")
    assert len(r2) == len({key(r) for r in r2}) == 3 * 8  # every rollout of the global batch, once
    assert {key(r): r["completion"] for r in r1} == {key(r): r["completion"] for r in r2}
    # rank 0 published the weights after every update: step k is sampled by version k - 1
    assert all(r["policy_version"] == r["step"] - 1 for r in r2)


def with_logged_reward(config: Path, log: Path) -> Path:
    """The config's target_fraction reward replaced by the same function logging each call (rewards_for_tests.py)."""
    data = yaml.safe_load(config.read_text())
    assert data["rewards"][0] == TARGET_REWARD
    data["rewards"][0] = {"name": TARGET_REWARD.replace(":target_fraction", ":target_fraction_logged"), "log": str(log)}
    config.write_text(yaml.safe_dump(data))
    return config


def test_ray_reward_workers_under_torchrun_match_one_process_with_rewards_in_the_learner(
    tmp_path, tiny_model_dir, word_prompts
):
    # Same global batch (8 completions = 2 groups of G = 4 per rank); rank 0 sends the 8 to 2 Ray reward actors.
    one = with_logged_reward(
        write_config(
            tmp_path,
            tiny_model_dir,
            word_prompts,
            "one",
            per_device_train_batch_size=4,
            gradient_accumulation_steps=2,
            max_steps=2,
        ),
        tmp_path / "one.log",
    )
    two = with_logged_reward(
        with_ray(
            write_config(
                tmp_path,
                tiny_model_dir,
                word_prompts,
                "two",
                per_device_train_batch_size=4,
                gradient_accumulation_steps=1,
                max_steps=2,
            ),
            num_reward_workers=2,
            reward_worker_cpus=0.5,
        ),
        tmp_path / "two.log",
    )
    torchrun(two)
    assert main(["train", str(one)]) == 0  # one process, no Ray, rewards in the learner

    calls = [line.split() for line in (tmp_path / "two.log").read_text().splitlines()]
    # 2 steps x 2 chunks of one group each (whole groups of the 8-row global batch), each on a Ray actor
    # that is not a torch.distributed rank; the 2 actors are 2 processes
    assert len(calls) == 4 and {(rank, actor, n) for _, rank, actor, n in calls} == {("0", "1", "4")}
    assert len({pid for pid, *_ in calls}) == 2
    local = [line.split() for line in (tmp_path / "one.log").read_text().splitlines()]
    # in the learner's worker process for that reward: one process, not this one, not a Ray actor
    assert {(actor, n) for _, _, actor, n in local} == {("0", "8")}
    assert len({pid for pid, *_ in local}) == 1 and str(os.getpid()) not in {pid for pid, *_ in local}

    m1, m2 = read_metrics(tmp_path / "one"), read_metrics(tmp_path / "two")
    assert [m["step"] for m in m2] == [1, 2]
    for a, b in zip(m1, m2):
        for k in ("reward", "rewards/target_fraction_logged/mean", "rewards/length/mean", "advantage/std"):
            assert a[k] == pytest.approx(b[k], abs=1e-6), k
        assert a["loss"] == pytest.approx(b["loss"], abs=1e-5)
        assert a["kl"] == pytest.approx(b["kl"], abs=1e-5)
    assert all(m["advantage/std"] > 0 for m in m1)  # every step trains on non-zero advantages
    r1, r2 = rollouts_of(tmp_path / "one"), rollouts_of(tmp_path / "two")
    assert len(r2) == len({key(r) for r in r2}) == 2 * 8  # every rollout of the global batch, once
    fields = lambda r: (r["completion"], r["rewards"], r["reward"], r["error"])
    assert {key(r): fields(r) for r in r1} == {key(r): fields(r) for r in r2}
    assert all(abs(a["advantage"] - b["advantage"]) < 1e-6 for a, b in zip(sorted(r1, key=key), sorted(r2, key=key)))


def test_async_rollouts_under_torchrun_with_fsdp(tmp_path, tiny_model_dir, word_prompts):
    # FSDP: publishing gathers the sharded weights to rank 0 (every rank joins), which puts them in Ray
    config = with_ray(
        write_config(
            tmp_path,
            tiny_model_dir,
            word_prompts,
            "async",
            per_device_train_batch_size=4,
            gradient_accumulation_steps=1,
        ),
        async_rollouts=True,
        strategy="fsdp",
    )
    torchrun(config)
    rows = rollouts_of(tmp_path / "async")
    assert len(rows) == len({key(r) for r in rows}) == 3 * 8
    # step 1 is sampled by version 0, step k > 1 while step k-1 trains, i.e. by version k-2
    assert {r["step"]: r["policy_version"] for r in rows} == {1: 0, 2: 0, 3: 1}
    metrics = read_metrics(tmp_path / "async")
    assert [m["policy_staleness"] for m in metrics] == [0, 1, 1]
    assert not any(m["nonfinite"] for m in metrics) and (tmp_path / "async" / "final").is_dir()
