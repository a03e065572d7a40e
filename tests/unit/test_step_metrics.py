"""train/metrics.py: a step's metrics and train()'s closing entry, against numbers worked out by hand."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
import torch

from grpokit.rewards.runner import RewardResult
from grpokit.train.metrics import (
    TRL_NAMES,
    PhaseClock,
    sample_metrics,
    step_metrics,
    stored_eval_names,
    train_summary,
    trl_eval_names,
    trl_names,
    window_log,
)


def test_step_metrics_by_hand():
    # Two groups of G = 2: rewards [1, 1 | 0, 1] -> the first group has zero variance: frac_reward_zero_std = 2/4.
    combined = torch.tensor([1.0, 1.0, 0.0, 1.0], dtype=torch.float64)
    rewards = RewardResult(["acc"], combined[:, None], combined, [None] * 4, {"acc": 0})
    advantages = torch.tensor([0.0, 0.0, -1.0, 1.0])  # mean 0; sample std sqrt((0 + 0 + 1 + 1) / 3) = 0.8165
    lengths = torch.tensor([2.0, 4.0, 6.0, 8.0])  # mean 5, min 2, max 8, sum 20
    truncated = torch.tensor([0.0, 0.0, 0.0, 1.0])  # 1 of 4
    times = {"time/generate": 1.0, "time/reward": 0.5, "time/logprobs": 0.25, "time/update": 0.25, "step_time": 2.0}
    source = SimpleNamespace(num_truncated=3, num_dropped=1)
    metrics = step_metrics(
        rewards,
        update={"loss": 0.5},
        advantages=advantages,
        group_size=2,
        lengths=lengths,
        truncated=truncated,
        prompt_tokens=10.0,
        source=source,
        staleness=1,
        times=times,
        extra={"restarts": 0.0},
        tokens_seen=130.0,
    )
    assert metrics["reward"] == pytest.approx(0.75)  # the RewardResult's own metrics come first
    assert metrics["loss"] == 0.5
    assert metrics["advantage/mean"] == 0.0
    assert metrics["advantage/std"] == pytest.approx((2 / 3) ** 0.5)
    assert metrics["frac_reward_zero_std"] == 0.5
    assert (metrics["completion_length/mean"], metrics["completion_length/min"], metrics["completion_length/max"]) == (
        5.0,
        2.0,
        8.0,
    )
    assert metrics["truncated_fraction"] == 0.25
    # the three that ended with EOS: lengths 2, 4, 6 -> mean 4, min 2, max 6 (TRL's terminated lengths)
    assert [metrics[f"completion_length/terminated_{s}"] for s in ("mean", "min", "max")] == [4.0, 2.0, 6.0]
    assert metrics["num_tokens"] == 130.0  # the run's tokens so far, as given
    assert (metrics["prompts_truncated"], metrics["prompts_dropped"], metrics["policy_staleness"]) == (3.0, 1.0, 1.0)
    assert metrics["tokens_per_second"] == 15.0  # (20 completion + 10 prompt tokens) / 2 s
    assert metrics["time/reward"] == 0.5 and metrics["step_time"] == 2.0 and metrics["restarts"] == 0.0
    keys = list(metrics)  # the order metrics.jsonl shows them in
    assert keys.index("loss") < keys.index("advantage/mean") < keys.index("time/generate") < keys.index("restarts")


def test_phase_clock_laps_add_up_to_the_step_time():
    clock = PhaseClock()
    time.sleep(0.01)
    clock.lap("generate")
    clock.lap("reward")
    times = clock.metrics()
    assert list(times) == ["time/generate", "time/reward", "step_time"]
    assert times["time/generate"] >= 0.01
    assert times["step_time"] == pytest.approx(times["time/generate"] + times["time/reward"])


def test_train_summary_by_hand():
    # 2 steps of 8 completions in 4 s: 16 / 4 = 4 samples/s, 0.5 steps/s, mean loss (1 + 2) / 2.
    assert train_summary([1.0, 2.0], 8, 4.0) == {
        "train_runtime": 4.0,
        "train_samples_per_second": 4.0,
        "train_steps_per_second": 0.5,
        "train_loss": 1.5,
    }
    assert train_summary([], 8, 0.0) == {
        "train_runtime": 0.0,
        "train_samples_per_second": 0.0,
        "train_steps_per_second": 0.0,
        "train_loss": 0.0,
    }


def test_terminated_lengths_are_zero_when_every_completion_was_cut():
    combined = torch.tensor([1.0, 0.0], dtype=torch.float64)
    rewards = RewardResult(["acc"], combined[:, None], combined, [None] * 2, {"acc": 0})
    metrics = sample_metrics(rewards, 2, torch.tensor([4.0, 4.0]), torch.tensor([1.0, 1.0]))
    assert [metrics[f"completion_length/terminated_{s}"] for s in ("mean", "min", "max")] == [0.0, 0.0, 0.0]
    assert metrics["truncated_fraction"] == 1.0 and metrics["frac_reward_zero_std"] == 0.0


def test_trl_names_map_grpokit_names_in_one_table():
    metrics = {
        "completion_length/mean": 5.0,
        "completion_length/min": 2.0,
        "completion_length/max": 8.0,
        "truncated_fraction": 0.25,
        "completion_length/terminated_mean": 4.0,
        "completion_length/terminated_min": 2.0,
        "completion_length/terminated_max": 6.0,
        "reward": 0.75,
        "rewards/acc/mean": 0.75,
        "kl": 0.01,
        "advantage/mean": 0.0,
    }
    assert trl_names(metrics) == {
        "completions/mean_length": 5.0,
        "completions/min_length": 2.0,
        "completions/max_length": 8.0,
        "completions/clipped_ratio": 0.25,
        "completions/mean_terminated_length": 4.0,
        "completions/min_terminated_length": 2.0,
        "completions/max_terminated_length": 6.0,
        "reward": 0.75,  # the same name in both
        "rewards/acc/mean": 0.75,
        "kl": 0.01,
        "advantage/mean": 0.0,  # grpokit's own, kept
    }
    assert set(TRL_NAMES) <= set(metrics)  # every mapped name is one step_metrics writes (checked above)


def test_eval_names_for_one_eval_set_and_for_a_dict_of_them():
    metrics = {"eval/reward": 0.5, "eval/completion_length/mean": 3.0, "eval/pass@1": 0.25, "eval/acc_logged": 1.0}
    assert trl_eval_names(metrics) == {
        "eval_reward": 0.5,
        "eval_completions/mean_length": 3.0,
        "eval_pass@1": 0.25,
        "eval_acc_logged": 1.0,
    }
    assert trl_eval_names(metrics, "eval_math")["eval_math_completions/mean_length"] == 3.0
    assert stored_eval_names(metrics) == metrics
    assert stored_eval_names(metrics, "math") == {
        "eval/math/reward": 0.5,
        "eval/math/completion_length/mean": 3.0,
        "eval/math/pass@1": 0.25,
        "eval/math/acc_logged": 1.0,
    }


def test_window_log_averages_the_steps_since_the_last_entry():
    # reward 1 and 3 -> 2; kl NaN at one step -> the other's 0.5 (TRL leaves NaN out); a metric NaN at every step is
    # left out; learning_rate, grad_norm and num_tokens: the last step's
    steps = [
        {"reward": 1.0, "kl": float("nan"), "entropy": float("nan"), "learning_rate": 0.1, "grad_norm": 2.0},
        {"reward": 3.0, "kl": 0.5, "entropy": float("nan"), "learning_rate": 0.05, "grad_norm": 4.0, "num_tokens": 9},
    ]
    assert window_log(steps) == {"reward": 2.0, "kl": 0.5, "learning_rate": 0.05, "grad_norm": 4.0, "num_tokens": 9.0}
    assert window_log(steps[:1]) == {"reward": 1.0, "learning_rate": 0.1, "grad_norm": 2.0}
