"""The numbers a training step logs, named here once: rewards, advantages, completion lengths, phase times,
throughput (``step_metrics``), and the closing entry of ``train()`` (``train_summary``, transformers' names)."""

from __future__ import annotations

import time

import torch

from grpokit.algos import zero_variance_groups


class PhaseClock:
    """Wall time of a step's phases: ``lap(name)`` ends phase ``name`` (metric ``time/<name>``, summed when a phase
    recurs, as in dynamic sampling's rounds) and starts the next."""

    def __init__(self):
        self.start = self.last = time.perf_counter()
        self.times: dict[str, float] = {}

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.times[f"time/{name}"] = self.times.get(f"time/{name}", 0.0) + now - self.last
        self.last = now

    def metrics(self) -> dict[str, float]:
        """Every phase's time and ``step_time``, from the start to the last lap."""
        return {**self.times, "step_time": self.last - self.start}


def step_metrics(
    rewards,
    *,
    update: dict[str, float],
    advantages: torch.Tensor,
    group_size: int,
    lengths: torch.Tensor,
    truncated: torch.Tensor,
    prompt_tokens: float,
    source,
    staleness: int,
    times: dict[str, float],
    extra: dict[str, float],
) -> dict[str, float]:
    """One step's metrics, over the global batch of N completions.

    ``rewards``: the step's ``RewardResult`` (its own metrics: per function, combined, logged); ``update``: the
    learner's metrics (averaged over ranks); ``advantages`` [N]; ``lengths`` [N] completion token counts;
    ``truncated`` [N] 1.0 where a completion hit max_completion_length; ``prompt_tokens``: the prompts' tokens,
    G times each; ``source``: the training PromptSource (its counts of prompts truncated and dropped so far);
    ``staleness``: updates since the policy that sampled the rollouts; ``times``: :meth:`PhaseClock.metrics`;
    ``extra``: the rollout scheduler's metrics. tokens_per_second = (completion + prompt tokens) / step_time.
    """
    return {
        **rewards.metrics(),
        **update,
        "advantage/mean": float(advantages.mean()),
        "advantage/std": float(advantages.std()) if advantages.numel() > 1 else float("nan"),  # none: no update
        "frac_reward_zero_std": float(zero_variance_groups(rewards.combined, group_size).float().mean()),
        "completion_length/mean": float(lengths.mean()),
        "completion_length/min": float(lengths.min()),
        "completion_length/max": float(lengths.max()),
        "truncated_fraction": float(truncated.mean()),
        "prompts_truncated": float(source.num_truncated),
        "prompts_dropped": float(source.num_dropped),
        "policy_staleness": float(staleness),
        **times,
        "tokens_per_second": (lengths.sum().item() + prompt_tokens) / times["step_time"],
        **extra,
    }


def train_summary(losses: list[float], completions_per_step: int, seconds: float) -> dict[str, float]:
    """TRL's closing log entry of ``train()``: transformers' speed metrics and the mean loss of ``losses`` (one
    per step run in this call)."""
    steps = len(losses)
    return {
        "train_runtime": round(seconds, 4),
        "train_samples_per_second": round(steps * completions_per_step / seconds, 3) if seconds else 0.0,
        "train_steps_per_second": round(steps / seconds, 3) if seconds else 0.0,
        "train_loss": sum(losses) / steps if steps else 0.0,
    }
