"""Corrections for rollouts sampled by an older (or a different) policy than the one being trained.

Three policies meet in an asynchronous step (Fu et al. 2025, AReaL, arXiv 2505.24298, section 5):

- the *behaviour* policy mu that sampled the tokens (an older version, K updates back at most, possibly another
  implementation such as vLLM): its log-probs are the rollouts' ``sampling_logprobs``;
- the *proximal* policy pi_prox: the learner's weights before this update, whose log-probs are the learner's own
  ``old_logprobs`` (recomputed, or ``logprobs.detach()`` with one update per batch);
- the policy pi_theta being trained (``logprobs``).

Corrections (:data:`CORRECTIONS`, the config's ``off_policy_correction``):

- ``behaviour`` (plain PPO off-policy; grpokit's one-step-off mode before bounded staleness): the ratio and its
  clip are taken against mu itself, r = pi_theta / mu. At K > 1 the clip then bounds the distance to a policy K
  updates old, not the update's own step: the trust region is lost (AReaL, table 3: AIME24 23.3 at eta = 4).
- ``decoupled_ppo`` (AReaL's decoupled objective, eq. 5): the clip is around the proximal policy and the
  behaviour weight w = pi_prox / mu multiplies the surrogate, no gradient:

      L_t = -w_t * min(r_t A, clip(r_t, 1 - eps, 1 + eps_high) A),  r_t = pi_theta / pi_prox,
      w_t = weight(pi_prox / mu)

  The weight is shaped by one of TRL's four ``vllm_importance_sampling_mode`` modes (:data:`WEIGHT_MODES`), with
  TRL's meaning: ``token_truncate`` (AReaL's capped weight, Yao et al. 2025's TIS), ``token_mask``,
  ``sequence_truncate``, and ``sequence_mask`` (masked importance sampling, MIS: a sequence whose ratio
  prod_t pi_prox / mu = exp(sum_t (log pi_prox - log mu)) falls outside [low, high] is left out whole; the ones
  kept are weighted by their ratio).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from grpokit.algos.masked import masked_mean
from grpokit.algos.names import (
    IMPORTANCE_WEIGHT_MODES,
    IS_CAPPED_FRACTION,
    IS_MASKED_FRACTION,
    IS_WEIGHT_MAX,
    IS_WEIGHT_MEAN,
    IS_WEIGHT_MIN,
)
from grpokit.system.registry import Registry

WEIGHT_MODES = IMPORTANCE_WEIGHT_MODES  # TRL's names and meaning


@dataclass(frozen=True)
class BehaviourWeights:
    """The behaviour weights of a batch and what they did: ``weights`` [N, T] (no gradient; a sequence mode's
    weight repeated over its tokens), ``clipped`` [N, T] bool (truncated at a bound) and ``masked`` [N, T] bool
    (set to 0 by a mask mode), both over the completion tokens only."""

    weights: torch.Tensor
    clipped: torch.Tensor
    masked: torch.Tensor


def behaviour_log_ratio(
    proximal_logprobs: torch.Tensor, behaviour_logprobs: torch.Tensor, completion_mask: torch.Tensor, level: str
) -> torch.Tensor:
    """log(pi_prox / mu): [N, T] per token (``level`` ``token``), or [N, 1] summed over each sequence's masked tokens
    (``sequence``: the log of the product of token ratios, as TRL's sequence modes take it). A NaN difference (a
    log-prob the sampler did not report) counts 0, as in TRL."""
    diff = torch.nan_to_num((proximal_logprobs.detach() - behaviour_logprobs) * completion_mask, nan=0.0)  # [N, T]
    if level == "token":
        return diff
    return diff.sum(dim=-1, keepdim=True)  # [N, T] -> [N, 1]


def behaviour_weights(
    proximal_logprobs: torch.Tensor,
    behaviour_logprobs: torch.Tensor,
    completion_mask: torch.Tensor,
    mode: str = "token_truncate",
    low: float | None = None,
    high: float | None = 3.0,
) -> BehaviourWeights:
    """The weights pi_prox / mu shaped by ``mode`` (one of :data:`WEIGHT_MODES`) with the bounds [low, high]
    (None: unbounded on that side), as TRL's ``vllm_importance_sampling_mode`` with ``clip_min`` / ``clip_max``:

    - ``*_truncate``: w = clamp(rho, low, high) (``clipped``: rho <= low or rho >= high);
    - ``*_mask``: w = rho where low <= rho <= high, else 0 (``masked``: rho < low or rho > high);

    where rho is per token (``token_*``) or one per sequence (``sequence_*``, exp of the summed log-ratio, shared by
    the sequence's tokens). Shapes: [N, T] in, [N, T] out. Padding gets weight 0 after masking by
    ``completion_mask`` downstream; here it gets rho = 1 (log-ratio 0)."""
    if mode not in WEIGHT_MODES:
        raise ValueError(f"unknown importance weight mode {mode!r}; valid choices: {', '.join(WEIGHT_MODES)}")
    level, how = mode.split("_")
    rho = torch.exp(behaviour_log_ratio(proximal_logprobs, behaviour_logprobs, completion_mask, level))  # [N, T|1]
    none = torch.zeros_like(rho, dtype=torch.bool)
    if how == "truncate":  # at a bound counts as clipped (the weight is the bound)
        outside = (rho <= low if low is not None else none) | (rho >= high if high is not None else none)
        weights = rho.clamp(min=low, max=high)
    else:  # strictly outside is masked, as TRL's mask modes
        outside = (rho < low if low is not None else none) | (rho > high if high is not None else none)
        weights = rho.masked_fill(outside, 0.0)
    real = completion_mask.bool()
    outside = outside.expand_as(completion_mask) & real  # [N, 1] -> [N, T] for the sequence modes
    nothing = torch.zeros_like(outside)
    clipped, masked = (outside, nothing) if how == "truncate" else (nothing, outside)
    return BehaviourWeights(weights.expand_as(completion_mask), clipped, masked)


def weight_metrics(found: BehaviourWeights, completion_mask: torch.Tensor) -> dict[str, float]:
    """The weights' statistics over the completion tokens: mean, max, min, and the fractions clipped and masked."""
    real = completion_mask.bool()
    values = found.weights[real]  # [n]
    if values.numel() == 0:
        return {}
    return {
        IS_WEIGHT_MEAN: masked_mean(found.weights, completion_mask).item(),
        IS_WEIGHT_MAX: values.max().item(),
        IS_WEIGHT_MIN: values.min().item(),
        IS_CAPPED_FRACTION: masked_mean(found.clipped.float(), completion_mask).item(),
        IS_MASKED_FRACTION: masked_mean(found.masked.float(), completion_mask).item(),
    }


@dataclass(frozen=True)
class Correction:
    """An off-policy correction: ``clip_to_behaviour`` (the ratio and its clip are against the behaviour policy's
    log-probs) or not (against the proximal policy's, the learner's own), and ``weighs_behaviour`` (the surrogate is
    multiplied by :func:`behaviour_weights`)."""

    clip_to_behaviour: bool
    weighs_behaviour: bool
    summary: str


# The corrections by name (the config's ``off_policy_correction``).
CORRECTIONS = Registry("off_policy_correction")
CORRECTIONS.register("behaviour")(
    Correction(True, False, "ratio and clip against the sampling policy (plain PPO off-policy)")
)
CORRECTIONS.register("decoupled_ppo")(
    Correction(False, True, "clip around the proximal policy, behaviour weight pi_prox / mu (AReaL's decoupled PPO)")
)


def get_correction(name: str) -> Correction:
    return CORRECTIONS.entry(name)
