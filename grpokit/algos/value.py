"""The critic's loss and its metrics: clipped value loss, clip fraction, explained variance.

Shapes: N sequences, T completion tokens; ``completion_mask`` [N, T] is 1 on real completion tokens.
``values`` are the critic's current predictions (with gradient), ``old_values`` its predictions when the
batch was collected, ``returns`` the GAE targets (``algos.gae.gae_advantages``).
"""

from __future__ import annotations

import torch

from grpokit.algos.masked import aggregate, masked_mean

# Added to the returns' variance in explained variance, as verl does, so constant returns stay finite.
EXPLAINED_VARIANCE_EPS = 1e-5


def explained_variance(values: torch.Tensor, returns: torch.Tensor, completion_mask: torch.Tensor) -> torch.Tensor:
    """1 - Var(returns - values) / (Var(returns) + 1e-5) over the masked tokens, [N, T] x [N, T] -> [].

    1 for a perfect critic, 0 for one no better than a constant, negative for a worse one (unbiased
    variances, as verl's ``critic/vf_explained_var``). NaN with fewer than two masked tokens.
    """
    real = completion_mask.bool()  # [N, T]
    targets = returns.detach()[real].float()  # [M]
    residuals = targets - values.detach()[real].float()  # [M]
    if targets.numel() < 2:
        return torch.tensor(float("nan"))
    return 1.0 - residuals.var() / (targets.var() + EXPLAINED_VARIANCE_EPS)


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    completion_mask: torch.Tensor,
    cliprange_value: float,
    vf_coef: float = 1.0,
    loss_type: str = "bnpo",
    *,
    num_items_in_batch: int | float | torch.Tensor | None = None,
    max_completion_length: int | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO's clipped value loss: (vf_coef * loss, metrics).

    V^clip = clip(V, old_V - c, old_V + c) and
    L_t = 0.5 * max((V_t - R_t)^2, (V^clip_t - R_t)^2)  (Schulman et al. 2017's value clipping as in
    OpenAI baselines' PPO2, TRL's former PPOTrainer and verl's ``compute_value_loss``), reduced over
    tokens by ``aggregate`` with ``loss_type``, an aggregation name (``names.AGGREGATIONS``; the run's loss type's
    ``aggregation``; ``bnpo``, the token mean, is verl's default "token-mean"; ``num_items_in_batch`` and
    ``max_completion_length`` as in ``aggregate``).

    Metrics (floats): ``value_loss`` (before ``vf_coef``), ``value_clip_frac`` (fraction of masked
    tokens where the clipped error is the larger, i.e. the clipped term is used), ``explained_variance``
    (of ``values`` against ``returns``; with one pass over the batch, ``values`` = ``old_values``).
    """
    if cliprange_value <= 0:
        raise ValueError(f"cliprange_value must be > 0, got {cliprange_value}")
    if not values.shape == old_values.shape == returns.shape == completion_mask.shape:
        raise ValueError(
            f"values {tuple(values.shape)}, old_values {tuple(old_values.shape)}, returns {tuple(returns.shape)} and "
            f"completion_mask {tuple(completion_mask.shape)} must have the same [N, T] shape"
        )
    old_values, returns = old_values.detach(), returns.detach()
    clipped = torch.clamp(values, old_values - cliprange_value, old_values + cliprange_value)  # [N, T]
    unclipped_error = (values - returns) ** 2  # [N, T]
    clipped_error = (clipped - returns) ** 2  # [N, T]
    per_token = torch.maximum(unclipped_error, clipped_error)  # [N, T]
    loss = 0.5 * aggregate(
        per_token,
        completion_mask,
        loss_type,
        num_items_in_batch=num_items_in_batch,
        max_completion_length=max_completion_length,
    )  # []
    clip_frac = masked_mean((clipped_error > unclipped_error).to(per_token.dtype), completion_mask)  # []
    metrics = {
        "value_loss": float(loss.detach()),
        "value_clip_frac": float(clip_frac),
        "explained_variance": float(explained_variance(values, returns, completion_mask)),
    }
    return vf_coef * loss, metrics
