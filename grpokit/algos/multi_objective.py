"""TRL's ``multi_objective_aggregation``: how several reward functions become one advantage.

- ``sum_then_normalize`` (the default, GRPO's): r_i = sum_f w_f r_if, then the group-relative advantage of r.
- ``normalize_then_sum`` (GDPO, Liu et al. 2026, "Group reward-Decoupled normalization Policy Optimization"): each
  function's rewards are normalised within their group first, z_if = (r_if - mean_group(r_f)) / (std_group(r_f) +
  1e-4), then x_i = sum_f w_f z_if, and A_i = (x_i - mean(x)) / (std(x) + 1e-4) over the whole batch.

NaN (a function that gave no reward) is left out of every mean and std and of the sum; a completion with no reward
at all gets advantage 0. Stds are unbiased, as TRL's ``nanstd``.
"""

from __future__ import annotations

import torch

AGGREGATIONS = ("sum_then_normalize", "normalize_then_sum")
STD_EPS = 1e-4


def normalize_then_sum(per_func: torch.Tensor, weights: torch.Tensor, num_generations: int) -> torch.Tensor:
    """x [N] from ``per_func`` [N, F] (NaN: absent) and ``weights`` [F], N = groups x ``num_generations``:
    each function's rewards normalised in their group, then weighted and summed (NaN where every function is)."""
    n, f = per_func.shape
    grouped = per_func.reshape(-1, num_generations, f)  # [B, G, F]
    mean = torch.nanmean(grouped, dim=1, keepdim=True)  # [B, 1, F]
    if num_generations > 1:
        count = (~grouped.isnan()).sum(dim=1, keepdim=True)  # [B, 1, F]
        std = (torch.nansum((grouped - mean) ** 2, dim=1, keepdim=True) / (count - 1)).sqrt()
    else:
        std = torch.zeros_like(mean)
    z = ((grouped - mean) / (std + STD_EPS)).reshape(n, f)  # [N, F]
    x = torch.nansum(z * weights.to(z.dtype)[None, :], dim=1)  # [N]
    return torch.where(per_func.isnan().all(dim=1), torch.nan, x)


def batch_normalized(x: torch.Tensor) -> torch.Tensor:
    """A [N] = (x - mean(x)) / (std(x) + 1e-4) over the batch (NaN left out; their advantage 0)."""
    present = ~x.isnan()
    mean = torch.nanmean(x)
    std = (torch.nansum((x - mean) ** 2) / (present.sum() - 1)).sqrt() if x.numel() > 1 else x.new_zeros(())
    return torch.nan_to_num((x - mean) / (std + STD_EPS), nan=0.0)
