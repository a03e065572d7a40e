"""Advantage estimators for groups of completions sampled from the same prompt.

``rewards`` is a float tensor [N] with N = B*G: the G completions of each of the B prompts are
adjacent. A NaN reward means "no reward applies"; it is left out of every mean and std, and its
completion gets advantage 0. A group whose (non-NaN) rewards are all equal carries no learning
signal and gets advantage exactly 0 under every estimator.
"""

from __future__ import annotations

import torch

from grpokit.algos.names import SCALE_REWARDS

# Added to the std before dividing, as in TRL's GRPOTrainer, so a near-constant group stays finite.
STD_EPS = 1e-4


def _grouped(rewards: torch.Tensor, num_generations: int) -> torch.Tensor:
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be 1-D [B*G], got shape {tuple(rewards.shape)}")
    if num_generations < 1 or rewards.numel() % num_generations:
        raise ValueError(f"{rewards.numel()} rewards do not split into groups of num_generations={num_generations}")
    if not rewards.is_floating_point():
        rewards = rewards.to(torch.get_default_dtype())
    return rewards.view(-1, num_generations)  # [N] -> [B, G]


def _nanstd(values: torch.Tensor, dim: int | None = None, keepdim: bool = False) -> torch.Tensor:
    """Unbiased (Bessel) std ignoring NaN; NaN where fewer than two values are present."""
    mean = torch.nanmean(values, dim=dim, keepdim=True)  # values with dim kept as size 1
    squares = (values - mean) ** 2  # same shape as values
    count = (~values.isnan()).sum(dim=dim, keepdim=keepdim)  # values with dim reduced
    total = torch.nansum(squares, dim=dim, keepdim=keepdim)  # values with dim reduced
    return torch.sqrt(total / (count - 1))


def zero_variance_groups(rewards: torch.Tensor, num_generations: int) -> torch.Tensor:
    """Bool mask [N], True for every completion of a group whose non-NaN rewards all equal.

    Such groups have zero advantage under every estimator; DAPO's dynamic sampling (Yu et al. 2025)
    drops them and samples more prompts. A group with at most one non-NaN reward counts as one.
    """
    grouped = _grouped(rewards, num_generations)  # [B, G]
    missing = grouped.isnan()  # [B, G]
    highest = grouped.masked_fill(missing, float("-inf")).amax(dim=1)  # [B, G] -> [B]
    lowest = grouped.masked_fill(missing, float("inf")).amin(dim=1)  # [B, G] -> [B]
    constant = ~(highest > lowest)  # [B]
    return constant.repeat_interleave(num_generations)  # [B] -> [N]


def _keep(rewards: torch.Tensor, num_generations: int) -> torch.Tensor:
    """Bool mask [N] of completions that get a non-zero advantage."""
    return ~rewards.isnan() & ~zero_variance_groups(rewards, num_generations)


def group_advantages(rewards: torch.Tensor, num_generations: int, scale_rewards: str = "group") -> torch.Tensor:
    """GRPO group-relative advantages, [N] -> [N].

    A_i = (r_i - mean(group(i))) / (std + 1e-4)  (Shao et al. 2024, DeepSeekMath), where std is

    - ``group``: the unbiased std of the rewards of group(i);
    - ``batch``: the unbiased std of all rewards of the batch (Liu et al. 2025 / TRL's "batch");
    - ``none``: no division, A_i = r_i - mean(group(i)) (Dr. GRPO, Liu et al. 2025).

    Same numbers as TRL's GRPOTrainer, plus NaN handling (see module docstring).
    """
    if scale_rewards not in SCALE_REWARDS:
        raise ValueError(f"unknown scale_rewards {scale_rewards!r}; valid choices: {', '.join(SCALE_REWARDS)}")
    grouped = _grouped(rewards, num_generations)  # [B, G]
    centered = grouped - torch.nanmean(grouped, dim=1, keepdim=True)  # [B, G]
    if scale_rewards == "group":
        centered = centered / (_nanstd(grouped, dim=1, keepdim=True) + STD_EPS)  # [B, G]
    elif scale_rewards == "batch":
        centered = centered / (_nanstd(grouped) + STD_EPS)  # [B, G]
    advantages = centered.reshape(-1)  # [B, G] -> [N]
    return torch.where(_keep(rewards, num_generations), advantages, 0.0)


def rloo_advantages(rewards: torch.Tensor, num_generations: int) -> torch.Tensor:
    """REINFORCE leave-one-out advantages, [N] -> [N].

    A_i = r_i - (1/(G-1)) sum_{j != i} r_j  (Kool et al. 2019; Ahmadian et al. 2024, "Back to
    Basics"). With NaN rewards, the baseline is the mean of the other non-NaN rewards of the group.
    """
    grouped = _grouped(rewards, num_generations)  # [B, G]
    present = ~grouped.isnan()  # [B, G]
    filled = grouped.nan_to_num(0.0)  # [B, G]
    total = filled.sum(dim=1, keepdim=True)  # [B, G] -> [B, 1]
    others = (present.sum(dim=1, keepdim=True) - 1).clamp(min=1)  # [B, G] -> [B, 1]
    advantages = (filled - (total - filled) / others).reshape(-1)  # [B, G] -> [N]
    return torch.where(_keep(rewards, num_generations), advantages, 0.0)


def reinforce_pp_advantages(rewards: torch.Tensor, num_generations: int) -> torch.Tensor:
    """REINFORCE++ with group baseline, [N] -> [N].

    x_i = r_i - mean(group(i)), then A_i = (x_i - mean(x)) / (std(x) + 1e-4) with mean and
    unbiased std over the whole batch (Hu 2025, "REINFORCE++", the "-baseline" variant for
    reasoning tasks). Completions of zero-variance groups keep x_i = 0 inside the batch statistics.
    """
    grouped = _grouped(rewards, num_generations)  # [B, G]
    centered = (grouped - torch.nanmean(grouped, dim=1, keepdim=True)).reshape(-1)  # [B, G] -> [N]
    advantages = (centered - torch.nanmean(centered)) / (_nanstd(centered) + STD_EPS)  # [N]
    return torch.where(_keep(rewards, num_generations), advantages, 0.0)
