"""The clipped surrogate of PPO and the GRPO family: ``grpo``, ``bnpo``, ``dr_grpo`` and ``dapo``.

One per-token loss (PPO's clipped objective, Schulman et al. 2017, as GRPO uses it, Shao et al. 2024),
registered under four names that differ only in their aggregation (``masked.aggregate``): each name is
also its aggregation's. ``luspo`` (luspo.py) registers it once more, with its own aggregation.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from grpokit.algos.loss_registry import LossSettings, register_loss
from grpokit.algos.names import CLIP_HIGH, CLIP_LOW, CLIP_REGION

if TYPE_CHECKING:
    import torch

    from grpokit.algos.losses import LossSpec, PolicyTerms


def clipped_surrogate(terms: PolicyTerms, spec: LossSpec) -> tuple[torch.Tensor, dict[str, float]]:
    """Per token: l_{i,t} = -min(r' A, clip(r, 1 - epsilon, 1 + epsilon_high) A), r' = min(r, delta).

    r is the importance ratio at the spec's level ([N, T] or [N, 1], ``terms.ratio``), A the advantage ([N, 1] or
    [N, T]); the result has their broadcast shape. With ``spec.delta`` (INTELLECT-2's two-sided clipping, arXiv
    2505.07291) the unclipped ratio is capped at delta too, so a token with A < 0 and a huge ratio no longer gets an
    unbounded loss; without it r' = r (PPO). Clipped tokens get no gradient: where the clipped term is the min.

    Metrics: clip_ratio/low_mean (r < 1 - epsilon with A < 0), clip_ratio/high_mean (r > 1 + epsilon_high with
    A > 0), clip_ratio/region_mean (either), as fractions of the masked tokens (of sequences at sequence level).
    """
    import torch

    ratio, advantages = terms.ratio, terms.advantages
    epsilon, epsilon_high = spec.epsilon, spec.upper_epsilon
    clipped_ratio = torch.clamp(ratio, 1.0 - epsilon, 1.0 + epsilon_high)  # [N, T] or [N, 1]
    if spec.delta is not None:
        ratio = torch.clamp(ratio, max=spec.delta)  # two-sided clipping
    per_token = -torch.min(ratio * advantages, clipped_ratio * advantages)  # [N, T] or [N, 1]
    with torch.no_grad():
        low, high = clip_regions(terms, spec)
        metrics = {
            CLIP_LOW: terms.batch_mean(low),
            CLIP_HIGH: terms.batch_mean(high),
            CLIP_REGION: terms.batch_mean(low | high),
        }
    return per_token, metrics


def clip_regions(terms: PolicyTerms, spec: LossSpec) -> tuple[torch.Tensor, torch.Tensor]:
    """(low, high): bool [N, T] or [N, 1], the tokens (sequences at sequence level) the clipped surrogate clips: low
    where r' < 1 - epsilon with A < 0, high where r' > 1 + epsilon_high with A > 0 (r' = min(r, delta) with
    ``spec.delta``); there its gradient is 0."""
    import torch

    ratio, advantages = terms.ratio.detach(), terms.advantages
    if spec.delta is not None:
        ratio = torch.clamp(ratio, max=spec.delta)
    low = (ratio < 1.0 - spec.epsilon) & (advantages < 0)  # [N, T] or [N, 1]
    high = (ratio > 1.0 + spec.upper_epsilon) & (advantages > 0)
    return low, high


def clipped_tokens(terms: PolicyTerms, spec: LossSpec) -> torch.Tensor:
    """bool [N, T] or [N, 1]: the clipped surrogate's clipped tokens (either region of :func:`clip_regions`)."""
    low, high = clip_regions(terms, spec)
    return low | high


def sequence_level_advice(settings: LossSettings) -> list[str]:
    """TRL's advice for a sequence-level ratio with a loss that sums tokens: each sequence then weighs by its length."""
    if settings.importance_sampling_level != "sequence":
        return []
    return [
        f"importance_sampling_level: sequence with loss_type: {settings.loss_type}, which sums per-token terms: each "
        "sequence weighs by its length instead of once (GSPO's per-sequence objective); GSPO's paper uses "
        "loss_type: grpo (or luspo, length-weighted on purpose)."
    ]


for _name in ("grpo", "bnpo", "dr_grpo", "dapo"):
    register_loss(
        _name,
        aggregation=_name,
        check=None if _name == "grpo" else sequence_level_advice,
        clipped=clipped_tokens,
    )(clipped_surrogate)
