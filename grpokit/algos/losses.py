"""The clipped policy-gradient surrogate of the GRPO family, with its KL penalty and aggregation.

Composition, not subclasses: ratio level (``token`` | ``sequence``) x clipping (epsilon,
epsilon_high) x KL penalty (beta, k3) x aggregation (``loss_type``), held by one frozen
:class:`LossSpec` built once per run (``GRPOConfig.loss_spec()``). Each combination gives the
same numbers as TRL's GRPOTrainer._compute_loss on the same tensors.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from grpokit.algos.kl import kl_estimate
from grpokit.algos.masked import aggregate, masked_mean
from grpokit.algos.names import (
    CLIP_HIGH,
    CLIP_LOW,
    CLIP_REGION,
    IMPORTANCE_SAMPLING_LEVELS,
    IS_CAPPED_FRACTION,
    IS_LOGPROB_ABS_DIFF,
    IS_WEIGHT_MEAN,
    KL,
    LOSS_TYPES,
    POLICY_LOSS,
    RATIO_MEAN,
)


@dataclass(frozen=True)
class LossSpec:
    """The settings of :func:`policy_loss` that stay fixed for a run; checked once, when built.

    Attributes:
        loss_type: aggregation, one of ``LOSS_TYPES`` (see ``grpokit.algos.masked.aggregate``).
        epsilon: lower clip range of the importance ratio.
        epsilon_high: upper clip range (DAPO's clip-higher); None means ``epsilon``.
        beta: KL coefficient; ``policy_loss`` then needs ``ref_logprobs``.
        use_bias_correction_kl: use r * k3 as each token's KL term (DeepSeek-V3.2's importance-weighted
            k3, TRL's ``use_bias_correction_kl``): its gradient is the unbiased reverse-KL gradient for
            samples drawn from the old policy. r is differentiable, so this changes the gradient even
            on-policy (r = 1): grad(r k3) = k3 grad(logp) + grad(k3). The ``kl`` metric stays plain k3.
        importance_sampling_level: ``token`` or ``sequence`` (GSPO), see ``importance_log_ratio``.
        max_completion_length: required by ``dr_grpo``.
        sampling_cap: cap C of the truncated importance weights applied with ``sampling_logprobs``.
    """

    loss_type: str = "dapo"
    epsilon: float = 0.2
    epsilon_high: float | None = None
    beta: float = 0.0
    use_bias_correction_kl: bool = False
    importance_sampling_level: str = "token"
    max_completion_length: int | None = None
    sampling_cap: float = 3.0

    def __post_init__(self) -> None:
        if self.loss_type not in LOSS_TYPES:
            raise ValueError(f"unknown loss_type {self.loss_type!r}; valid choices: {', '.join(LOSS_TYPES)}")
        if self.importance_sampling_level not in IMPORTANCE_SAMPLING_LEVELS:
            raise ValueError(
                f"unknown importance_sampling_level {self.importance_sampling_level!r}; "
                f"valid choices: {', '.join(IMPORTANCE_SAMPLING_LEVELS)}"
            )

    @property
    def upper_epsilon(self) -> float:
        """epsilon_high, or epsilon when it is None."""
        return self.epsilon if self.epsilon_high is None else self.epsilon_high


def importance_log_ratio(
    logprobs: torch.Tensor, old_logprobs: torch.Tensor, completion_mask: torch.Tensor, level: str = "token"
) -> torch.Tensor:
    """Log importance weights: [N, T] at token level, [N, 1] at sequence level.

    - ``token`` (PPO, Schulman et al. 2017; GRPO): log r_{i,t} = logp_{i,t} - old_logp_{i,t}.
    - ``sequence`` (GSPO, Zheng et al. 2025): log r_i = (1/|o_i|) sum_t m_{i,t} (logp - old_logp),
      the length-normalised sequence log-ratio, shared by every token of the sequence.
    """
    if level not in IMPORTANCE_SAMPLING_LEVELS:
        raise ValueError(
            f"unknown importance_sampling_level {level!r}; valid choices: {', '.join(IMPORTANCE_SAMPLING_LEVELS)}"
        )
    log_ratio = logprobs - old_logprobs  # [N, T]
    if level == "token":
        return log_ratio
    return masked_mean(log_ratio, completion_mask, dim=-1).unsqueeze(-1)  # [N, T] -> [N] -> [N, 1]


def truncated_importance_weights(
    old_logprobs: torch.Tensor, sampling_logprobs: torch.Tensor, cap: float
) -> torch.Tensor:
    """[N, T] truncated importance weights w_t = min(exp(old_logp_t - sampling_logp_t), cap), no gradient.

    Truncated importance sampling (TIS; Yao et al. 2025, "Your Efficient RL Framework Secretly Brings
    You Off-Policy RL Training"; TRL's ``vllm_importance_sampling_correction``, token_truncate): the
    tokens were drawn by a different implementation of the policy (vLLM's kernels and sampler), whose
    log-probs ``sampling_logprobs`` differ from the learner's ``old_logprobs`` for the same weights.
    The weight turns the sampler's distribution into the learner's; the cap bounds its variance. A
    NaN difference (a log-prob the sampler did not report) gives weight 1.
    """
    log_weights = torch.nan_to_num(old_logprobs.detach() - sampling_logprobs, nan=0.0)  # [N, T]
    return torch.exp(log_weights).clamp(max=cap)  # [N, T]; inf -> cap on padding


def _batch_mean(values: torch.Tensor, completion_mask: torch.Tensor, level: str) -> float:
    """Masked token mean at token level; at sequence level, where values are [N, 1] (one per
    sequence), the plain mean over sequences (as TRL)."""
    values = values.float()
    if level == "sequence":
        return values.mean().item()
    return masked_mean(values, completion_mask).item()


def policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor | None,
    advantages: torch.Tensor,
    completion_mask: torch.Tensor,
    spec: LossSpec = LossSpec(),
    *,
    ref_logprobs: torch.Tensor | None = None,
    num_items_in_batch: int | float | torch.Tensor | None = None,
    sampling_logprobs: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Clipped surrogate loss with optional KL penalty; returns (scalar loss, metrics).

    Per token, with r the importance ratio (see ``importance_log_ratio``) and A_i the advantage:

        L_{i,t} = -min(r A_i, clip(r, 1 - epsilon, 1 + epsilon_high) A_i) + beta * k3_{i,t}
        k3_{i,t} = exp(ref - logp) - (ref - logp) - 1

    (Shao et al. 2024 for GRPO; asymmetric "clip-higher" epsilon_high from DAPO, Yu et al. 2025;
    sequence-level ratio from GSPO, Zheng et al. 2025), then reduced to a scalar by ``loss_type``
    (see ``grpokit.algos.masked.aggregate``). The settings come from ``spec`` (:class:`LossSpec`).

    Args:
        logprobs: [N, T] log-probs of the completion tokens under the policy being trained.
        old_logprobs: [N, T] log-probs under the policy that sampled them; None means on-policy
            (one update per batch), where ``logprobs.detach()`` is used: ratio 1, gradient A grad logp.
        advantages: [N], one per sequence (the GRPO family), or [N, T], one per token (PPO; token-level ratio
            only: A_{i,t} replaces A_i in the formula above).
        completion_mask: [N, T], 1 for real completion tokens (float or bool).
        ref_logprobs: [N, T] log-probs under the reference model; required when ``spec.beta`` > 0.
        num_items_in_batch: completion tokens in the whole generation batch, for ``dapo``.
        sampling_logprobs: [N, T] log-probs reported by a separate sampler (vLLM); when given, each
            token's surrogate term (not the KL term) is multiplied by
            ``truncated_importance_weights(old_logprobs, sampling_logprobs, spec.sampling_cap)``.

    Metrics (python floats, named in ``grpokit.algos.names``): clip_ratio/low_mean (ratio < 1-eps
    with A < 0), clip_ratio/high_mean (ratio > 1+eps_high with A > 0), clip_ratio/region_mean
    (either), as fractions of masked tokens (of sequences at sequence level); ratio_mean; policy_loss
    (loss without the KL term); kl (masked mean of k3, only when beta > 0); with sampling log-probs
    sampling_is/weight_mean, sampling_is/capped_fraction and sampling_is/logprob_abs_diff.
    """
    if completion_mask.shape != logprobs.shape or advantages.shape not in (logprobs.shape[:1], logprobs.shape):
        raise ValueError(
            f"expected logprobs and completion_mask [N, T] and advantages [N] or [N, T]; got {tuple(logprobs.shape)}, "
            f"{tuple(completion_mask.shape)} and {tuple(advantages.shape)}"
        )
    per_token = advantages.dim() == 2
    if per_token and spec.importance_sampling_level == "sequence":
        raise ValueError(
            "per-token advantages [N, T] (PPO) cannot be used with importance_sampling_level='sequence' (GSPO's "
            "one ratio per sequence); use importance_sampling_level='token'."
        )
    if spec.beta > 0 and ref_logprobs is None:
        raise ValueError("beta > 0 needs ref_logprobs (log-probs under the reference model)")
    epsilon, epsilon_high, level = spec.epsilon, spec.upper_epsilon, spec.importance_sampling_level
    if old_logprobs is None:
        old_logprobs = logprobs.detach()

    log_weights = importance_log_ratio(logprobs, old_logprobs, completion_mask, level)
    ratio = torch.exp(log_weights)  # [N, T] or [N, 1]
    clipped_ratio = torch.clamp(ratio, 1.0 - epsilon, 1.0 + epsilon_high)  # [N, T] or [N, 1]
    if not per_token:
        advantages = advantages.unsqueeze(-1)  # [N] -> [N, 1], shared by the sequence's tokens
    surrogate = -torch.min(ratio * advantages, clipped_ratio * advantages)  # [N, T] or [N, 1]
    surrogate = surrogate.expand_as(logprobs)  # [N, 1] -> [N, T] at sequence level
    if sampling_logprobs is not None:
        is_weights = truncated_importance_weights(old_logprobs, sampling_logprobs, spec.sampling_cap)  # [N, T]
        surrogate = surrogate * is_weights
    aggregation = {"max_completion_length": spec.max_completion_length, "num_items_in_batch": num_items_in_batch}
    pg_loss = aggregate(surrogate, completion_mask, spec.loss_type, **aggregation)  # [N, T] -> []
    loss = pg_loss

    with torch.no_grad():
        low = (ratio < 1.0 - epsilon) & (advantages < 0)  # [N, T] or [N, 1]
        high = (ratio > 1.0 + epsilon_high) & (advantages > 0)  # [N, T] or [N, 1]
        metrics = {
            CLIP_LOW: _batch_mean(low, completion_mask, level),
            CLIP_HIGH: _batch_mean(high, completion_mask, level),
            CLIP_REGION: _batch_mean(low | high, completion_mask, level),
            RATIO_MEAN: _batch_mean(ratio, completion_mask, level),
            POLICY_LOSS: pg_loss.item(),
        }
        if sampling_logprobs is not None:
            metrics[IS_WEIGHT_MEAN] = masked_mean(is_weights, completion_mask).item()
            metrics[IS_CAPPED_FRACTION] = masked_mean((is_weights >= spec.sampling_cap).float(), completion_mask).item()
            mismatch = torch.nan_to_num(
                old_logprobs - sampling_logprobs, nan=0.0, posinf=0.0, neginf=0.0
            ).abs()  # [N, T]
            metrics[IS_LOGPROB_ABS_DIFF] = masked_mean(mismatch, completion_mask).item()
    if spec.beta > 0:
        kl = kl_estimate(logprobs, ref_logprobs, "k3")  # [N, T]
        penalty = kl * ratio if spec.use_bias_correction_kl else kl  # [N, T] (ratio [N, 1] at sequence level)
        loss = pg_loss + spec.beta * aggregate(penalty, completion_mask, spec.loss_type, **aggregation)  # []
        metrics[KL] = masked_mean(kl.detach(), completion_mask).item()
    return loss, metrics
