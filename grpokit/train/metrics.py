"""The numbers a training step logs, named here once: rewards, advantages, completion lengths, phase times,
throughput (``step_metrics``), the closing entry of ``train()`` (``train_summary``, transformers' names), and
the one table from grpokit's metric names (metrics.jsonl, the store, the console) to TRL's (``trainer.state.
log_history``, callbacks' ``on_log`` / ``on_evaluate``, ``trainer.evaluate()``): ``TRL_NAMES``."""

from __future__ import annotations

import math
import time

import torch

from grpokit.algos import zero_variance_groups

# grpokit's name -> TRL 1.16's, for the metrics whose names differ. Every other name is the same in both
# (reward, reward_std, rewards/<fn>/mean and /std, frac_reward_zero_std, kl, entropy, clip_ratio/*, loss,
# grad_norm, learning_rate, num_tokens, a log_metric name) or grpokit's own (advantage/*, time/*, beta ...),
# kept as it is.
TRL_NAMES = {
    "completion_length/mean": "completions/mean_length",
    "completion_length/min": "completions/min_length",
    "completion_length/max": "completions/max_length",
    "truncated_fraction": "completions/clipped_ratio",
    "completion_length/terminated_mean": "completions/mean_terminated_length",
    "completion_length/terminated_min": "completions/min_terminated_length",
    "completion_length/terminated_max": "completions/max_terminated_length",
}
EVAL = "eval/"  # grpokit's prefix of evaluation metrics (TRL's: "eval_")
# Metrics a TRL log entry gives the last value of (transformers' learning rate and gradient norm; TRL's running
# token count); every other metric of an entry is its mean over the steps since the previous entry.
LAST_VALUE = ("learning_rate", "grad_norm", "num_tokens")


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


def sample_metrics(rewards, group_size: int, lengths: torch.Tensor, truncated: torch.Tensor) -> dict[str, float]:
    """What a batch of sampled completions logs, in training and in evaluation: the rewards' own metrics
    (``rewards``, a ``RewardResult``: per function, combined, logged), ``frac_reward_zero_std`` (groups of
    ``group_size`` whose rewards all tie), completion lengths (``lengths`` [N] tokens the model wrote) and
    ``truncated_fraction`` (``truncated`` [N] 1.0 where a completion hit max_completion_length), and the lengths of
    the completions that ended with EOS (all 0 when none did, as TRL logs them)."""
    terminated = lengths[truncated == 0]
    if terminated.numel() == 0:
        terminated = torch.zeros(1)
    return {
        **rewards.metrics(),
        "frac_reward_zero_std": float(zero_variance_groups(rewards.combined, group_size).float().mean()),
        "completion_length/mean": float(lengths.float().mean()),
        "completion_length/min": float(lengths.min()),
        "completion_length/max": float(lengths.max()),
        "truncated_fraction": float(truncated.float().mean()),
        "completion_length/terminated_mean": float(terminated.float().mean()),
        "completion_length/terminated_min": float(terminated.min()),
        "completion_length/terminated_max": float(terminated.max()),
    }


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
    tokens_seen: float = 0.0,
) -> dict[str, float]:
    """One step's metrics, over the global batch of N completions.

    ``rewards``: the step's ``RewardResult`` (its own metrics: per function, combined, logged); ``update``: the
    learner's metrics (averaged over ranks); ``advantages`` [N]; ``lengths`` [N] completion token counts;
    ``truncated`` [N] 1.0 where a completion hit max_completion_length; ``prompt_tokens``: the prompts' tokens,
    G times each; ``source``: the training PromptSource (its counts of prompts truncated and dropped so far);
    ``staleness``: updates since the policy that sampled the rollouts; ``times``: :meth:`PhaseClock.metrics`;
    ``extra``: the rollout scheduler's metrics; ``tokens_seen``: prompt and completion tokens of the run so far,
    this step's included (TRL's ``num_tokens``). tokens_per_second = (completion + prompt tokens) / step_time.
    """
    return {
        **sample_metrics(rewards, group_size, lengths, truncated),
        **update,
        "advantage/mean": float(advantages.mean()),
        "advantage/std": float(advantages.std()) if advantages.numel() > 1 else float("nan"),  # none: no update
        "prompts_truncated": float(source.num_truncated),
        "prompts_dropped": float(source.num_dropped),
        "policy_staleness": float(staleness),
        **times,
        "tokens_per_second": (lengths.sum().item() + prompt_tokens) / times["step_time"],
        "num_tokens": float(tokens_seen),
        **extra,
    }


def token_staleness_sums(rollouts, staleness: int) -> torch.Tensor:
    """[2]: the sum over completion tokens of each token's staleness, and the number of tokens. A token's staleness
    is ``staleness`` (updates between ``rollouts.policy_version``, the oldest, and the policy trained) less how much
    newer its own version is (``token_versions``: a partial rollout's tokens continued on newer weights)."""
    mask = rollouts.completion_mask  # [N, T]
    count = mask.sum()
    newer = torch.zeros(())
    if rollouts.token_versions is not None:
        newer = ((rollouts.token_versions - rollouts.policy_version).float() * mask).sum()
    return torch.stack([staleness * count - newer, count]).float()  # [2]


def trl_names(metrics: dict) -> dict:
    """``metrics`` (grpokit's names) under TRL's names (:data:`TRL_NAMES`), the other names kept."""
    return {TRL_NAMES.get(name, name): value for name, value in metrics.items()}


def window_log(steps: list[dict]) -> dict:
    """TRL's log entry for the steps since the previous one (``steps``: each step's metrics, in order, under TRL's
    names; logging_steps of them, or fewer at the end of a run): each metric's mean over the steps where it is a
    finite number (TRL leaves NaN out; a metric with none is left out here, where TRL writes None), the last value
    of :data:`LAST_VALUE`. One step: its own metrics (NaN left out)."""
    names = list(dict.fromkeys(name for step in steps for name in step))
    entry = {}
    for name in names:
        values = [float(s[name]) for s in steps if name in s and isinstance(s[name], (int, float))]
        values = [v for v in values if math.isfinite(v)]
        if values:
            entry[name] = values[-1] if name in LAST_VALUE else sum(values) / len(values)
    return entry


def stored_eval_names(metrics: dict, dataset: str | None = None) -> dict:
    """An evaluation's metrics (``eval/<name>``) as metrics.jsonl keeps them: ``eval/<dataset>/<name>`` for one of
    a dict of eval datasets, else unchanged."""
    if dataset is None:
        return dict(metrics)
    return {f"{EVAL}{dataset}/{name.removeprefix(EVAL)}": value for name, value in metrics.items()}


def trl_eval_names(metrics: dict, prefix: str = "eval") -> dict:
    """An evaluation's metrics (``eval/<name>``) under TRL's names: ``<prefix>_<TRL name>``, where ``prefix`` is TRL's
    ``metric_key_prefix`` (``eval``; ``eval_<dataset>`` for one of a dict of eval datasets)."""
    return {f"{prefix}_{TRL_NAMES.get(bare, bare)}": value for bare, value in _without_eval(metrics).items()}


def _without_eval(metrics: dict) -> dict:
    return {name.removeprefix(EVAL): value for name, value in metrics.items()}


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
