"""vLLM in Ray rollout workers with the real vLLM CPU build: 1 learner + 2 Ray workers, each holding its own engine
in its own process. Weights go by version through the object store into each worker's copy, then into its vLLM by
the in-place reload; the float32 log-prob gap stays <= GAP_FP32 at every step; a worker killed (SIGKILL) between
steps is replaced and its chunk re-run with the same seeds: the stored rollouts equal those of a run nobody killed."""

from __future__ import annotations

import gc
import os
import signal

import pytest
from real_vllm_helpers import GAP_FP32, SETTINGS, TARGET_REWARD, metrics, prompts

from grpokit import GRPOConfig, GRPOTrainer
from grpokit.store import RolloutStore

ray = pytest.importorskip("ray", reason="the vLLM environment has no ray: make test-vllm installs grpokit[ray] there")

RAY = dict(backend="ray", num_rollout_workers=2, rollout_worker_cpus=1, ray_num_cpus=2, dtype="float32", max_steps=3)


@pytest.fixture(autouse=True)
def no_kv_space_override(monkeypatch):
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)  # each worker's engine: vllm_kv_cache_gib (0.25)
    yield
    ray.shutdown()


def stored(run) -> list[tuple]:
    with RolloutStore(run / "rollouts.sqlite", readonly=True) as store:
        return [(r["step"], r["prompt_index"], r["completion"], r["policy_version"]) for r in store.rollouts()]


def ray_trainer(run, **overrides) -> GRPOTrainer:
    args = GRPOConfig(**{**SETTINGS, **RAY, "output_dir": str(run), **overrides})
    return GRPOTrainer(args.model_name_or_path, TARGET_REWARD, args=args, train_dataset=prompts())


def test_two_ray_workers_with_vllm_and_a_killed_worker(tmp_path, vllm_model_dir):
    straight = ray_trainer(tmp_path / "straight", model_name_or_path=str(vllm_model_dir))
    assert type(straight.engine).__name__ == "HFRolloutEngine"  # the learner's own: versions and evaluation
    straight.train()
    lines = metrics(tmp_path / "straight")
    assert [line["step"] for line in lines] == [1, 2, 3]
    for line in lines:
        assert line["sampling_is/logprob_abs_diff"] <= GAP_FP32, line  # every worker's engine in sync, every step
        assert line["rollout_worker_sync_gap_max"] <= GAP_FP32, line  # each worker: vLLM against its copy's weights
        assert line["rollout_worker_restarts"] == 0
    del straight
    gc.collect()
    ray.shutdown()

    killed = ray_trainer(tmp_path / "killed", model_name_or_path=str(vllm_model_dir))
    remote = killed.run.rollout_scheduler.source.sampler.remote
    pids = [ray.get(w.pid.remote()) for w in remote.workers]
    assert len(set(pids)) == 2 and os.getpid() not in pids  # two engines, each in its own process
    score_values = killed.run.rewards.score_values

    def score_then_kill(*args, **kwargs):
        if killed.loop.step == 1 and remote.restarts == 0:
            os.kill(pids[1], signal.SIGKILL)  # step 2 is sent to a dead worker: replaced, its chunk re-run
        return score_values(*args, **kwargs)

    killed.run.rewards.score_values = score_then_kill
    killed.train()
    lines = metrics(tmp_path / "killed")
    assert [line["rollout_worker_restarts"] for line in lines] == [0, 1, 1]
    assert all(line["sampling_is/logprob_abs_diff"] <= GAP_FP32 for line in lines), lines
    assert stored(tmp_path / "killed") == stored(tmp_path / "straight")  # same seeds, same weights: same rollouts
