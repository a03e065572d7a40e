"""A step's memory metrics (the process's peak RSS; CUDA's peak allocation, against torch.cuda's API, mocked here)
and each reward function's wall time per batch (rewards/<name>/seconds)."""

from __future__ import annotations

import resource
import time

import torch

from grpokit.machine import peak_memory
from grpokit.machine.peak_memory import GIB, step_memory
from grpokit.rewards.contract import run_call
from grpokit.rewards.runner import RewardRunner
from grpokit.train.experience.rounds import join_rewards


def test_cpu_step_logs_the_peak_rss():
    metrics = step_memory(torch.device("cpu"))
    assert set(metrics) == {"memory/peak_rss_gib"}
    # ru_maxrss is KiB on Linux: the metric is it in GiB (it only grows, so read it before and after)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GIB
    assert before <= step_memory(torch.device("cpu"))["memory/peak_rss_gib"] <= 1024  # a test process: < 1 TiB
    assert metrics["memory/peak_rss_gib"] > 0


def test_cuda_step_logs_the_allocators_peak_and_resets_it(monkeypatch):
    calls = []

    def recorded(name: str, value=None):
        return lambda device=None: calls.append((name, device)) or value

    monkeypatch.setattr(torch.cuda, "max_memory_allocated", recorded("alloc", 3 * GIB))
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", recorded("res", GIB // 2))
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", recorded("reset"))
    monkeypatch.setattr(peak_memory, "peak_rss_bytes", lambda: 2 * GIB)
    device = torch.device("cuda", 1)
    metrics = step_memory(device)
    assert metrics == {
        "memory/peak_rss_gib": 2.0,
        "memory/cuda_max_allocated_gib": 3.0,
        "memory/cuda_max_reserved_gib": 0.5,
    }
    assert calls == [("alloc", device), ("res", device), ("reset", device)]  # read, then reset for the next step


def slow(completions, **kwargs):
    time.sleep(0.05)
    return [1.0] * len(completions)


def stuck(completions, **kwargs):
    time.sleep(2.0)
    return [1.0] * len(completions)


def broken(completions, **kwargs):
    time.sleep(0.02)
    raise ValueError("no")


def test_each_reward_functions_time_is_logged():
    with RewardRunner([slow, broken, stuck], isolate=False, timeout=0.5) as runner:
        result = runner.score(["p"] * 2, ["a", "b"], group_size=2)
    metrics = result.metrics()
    assert metrics["rewards/slow/seconds"] >= 0.05  # slept 0.05 s at least
    assert metrics["rewards/broken/seconds"] >= 0.02  # a call that raised is timed as well
    assert metrics["rewards/stuck/seconds"] == 0.5  # timed out: the timeout
    # dynamic sampling's rounds run one after the other: their times add up
    assert join_rewards([result, result]).seconds["stuck"] == 1.0


def test_run_call_times_the_call():
    outcome = run_call(slow, {"completions": ["a"]}, 1)
    assert outcome.seconds >= 0.05 and outcome.output == [1.0]
