"""The policy loss of the GRPO family: a registered per-token loss, its masks, KL penalty and aggregation.

Composition, not subclasses: ratio level (``token`` | ``sequence``) x per-token loss (``loss_type``, a
registered loss: the clipped surrogate of grpo / bnpo / dr_grpo / dapo / luspo, cispo, sapo, vespo; see
``loss_registry``) x masks (off-policy sequences, high-entropy tokens) x KL penalty (beta, k3) x the
loss's aggregation, held by one frozen :class:`LossSpec` built once per run (``GRPOConfig.loss_spec()``).
Each built-in loss gives the same numbers as TRL's GRPOTrainer._compute_loss on the same tensors.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from grpokit.algos.kl import kl_estimate
from grpokit.algos.loss_registry import get_loss
from grpokit.algos.masked import aggregate, masked_mean
from grpokit.algos.names import (
    IMPORTANCE_SAMPLING_LEVELS,
    IMPORTANCE_WEIGHT_MODES,
    IS_LOGPROB_ABS_DIFF,
    KL,
    OFF_POLICY_DROPPED,
    POLICY_LOSS,
    RATIO_MEAN,
)
from grpokit.algos.offpolicy import behaviour_weights, weight_metrics
from grpokit.algos.token_masks import off_policy_sequence_mask


@dataclass(frozen=True)
class LossSpec:
    """The settings of :func:`policy_loss` that stay fixed for a run; checked once, when built.

    Attributes:
        loss_type: a registered loss (``loss_registry.loss_types()``).
        epsilon: lower clip range of the importance ratio.
        epsilon_high: upper clip range (DAPO's clip-higher); None means ``epsilon``. For ``cispo`` the cap of the
            importance weight itself (ScaleRL's epsilon_max, as TRL reads it).
        beta: KL coefficient; ``policy_loss`` then needs ``ref_logprobs``.
        use_bias_correction_kl: use r * k3 as each token's KL term (DeepSeek-V3.2's importance-weighted
            k3, TRL's ``use_bias_correction_kl``): its gradient is the unbiased reverse-KL gradient for
            samples drawn from the old policy. r is differentiable, so this changes the gradient even
            on-policy (r = 1): grad(r k3) = k3 grad(logp) + grad(k3). The ``kl`` metric stays plain k3.
        importance_sampling_level: ``token`` or ``sequence`` (GSPO), see ``importance_log_ratio``.
        max_completion_length: required by ``dr_grpo``.
        sampling_cap: cap C of the truncated importance weights applied with ``sampling_logprobs`` (the upper
            bound of ``sampling_is_mode``'s range).
        sampling_is_mode: how the weights pi_old / mu of ``sampling_logprobs`` are shaped
            (``offpolicy.behaviour_weights``: TRL's token_truncate, token_mask, sequence_truncate, sequence_mask).
        sampling_is_min: the lower bound of that range; None: none.
        delta: the clipped surrogate's upper bound on the unclipped ratio (INTELLECT-2's two-sided clipping); None:
            none.
        params: the loss's own parameters (the dataclass it registered: ``sapo.SapoParams`` ...), or None.
        off_policy_mask_threshold: drop sequences with A < 0 whose mean KL(sampler || policy) exceeds it
            (DeepSeek-V3.2's off-policy sequence masking, ``token_masks.off_policy_sequence_mask``); None: off.
    """

    loss_type: str
    epsilon: float
    epsilon_high: float | None
    beta: float
    use_bias_correction_kl: bool
    importance_sampling_level: str
    max_completion_length: int | None
    sampling_cap: float | None
    sampling_is_mode: str
    sampling_is_min: float | None
    delta: float | None
    off_policy_mask_threshold: float | None
    params: Any = None

    def __post_init__(self) -> None:
        kind = get_loss(self.loss_type)  # a ValueError naming the registered losses
        if self.params is None and kind.params is not None:  # the loss's own defaults
            object.__setattr__(self, "params", kind.make_params({}))
        if self.importance_sampling_level not in IMPORTANCE_SAMPLING_LEVELS:
            raise ValueError(
                f"unknown importance_sampling_level {self.importance_sampling_level!r}; "
                f"valid choices: {', '.join(IMPORTANCE_SAMPLING_LEVELS)}"
            )
        if self.sampling_is_mode not in IMPORTANCE_WEIGHT_MODES:
            raise ValueError(
                f"unknown sampling_is_mode {self.sampling_is_mode!r}; "
                f"valid choices: {', '.join(IMPORTANCE_WEIGHT_MODES)}"
            )

    @property
    def upper_epsilon(self) -> float:
        """epsilon_high, or epsilon when it is None."""
        return self.epsilon if self.epsilon_high is None else self.epsilon_high


@dataclass(frozen=True)
class PolicyTerms:
    """One micro-batch's tensors, as a registered loss receives them. N sequences, T tokens; R is T at token
    level and 1 at sequence level.

    logprobs: [N, T] the policy's log-probs (with gradient). log_ratio: [N, T] logp - old_logp per token (with
    gradient). ratio: [N, R] the importance ratio at ``level`` (``importance_log_ratio``, exponentiated; with
    gradient). advantages: [N, 1] one per sequence, or [N, T] one per token (PPO). mask: [N, T] 1 on the tokens
    that count. level: ``token`` or ``sequence``. sampling_weights: [N, T] vLLM's truncated importance weights
    (``truncated_importance_weights``, no gradient) or None.
    """

    logprobs: torch.Tensor
    log_ratio: torch.Tensor
    ratio: torch.Tensor
    advantages: torch.Tensor
    mask: torch.Tensor
    level: str
    sampling_weights: torch.Tensor | None = None

    def batch_mean(self, values: torch.Tensor) -> float:
        """Mean of ``values`` over the micro-batch: over the masked tokens for [N, T] values; over the sequences
        for one value per sequence ([N, 1], as at sequence level), as TRL's metrics."""
        values = values.float()
        if self.level == "sequence" or values.shape[-1] != self.mask.shape[-1]:
            return values.mean().item()
        return masked_mean(values, self.mask).item()


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


def token_weights(
    mask: torch.Tensor,
    clipped: torch.Tensor | None = None,
    kept: torch.Tensor | None = None,
    token_mask: torch.Tensor | None = None,
    is_weights: torch.Tensor | None = None,
) -> torch.Tensor:
    """[N, T] each token's weight in the policy term: w_{i,t} = m_{i,t} (1 - c_{i,t}) o_i h_{i,t} s_{i,t}.

    m: ``mask`` [N, T], the loss mask (0 on padding, on tool tokens, on truncated completions when they are masked);
    c: ``clipped`` [N, T] or [N, 1], 1 where the loss clips (its gradient is 0 there); o: ``kept`` [N, 1] or [N, T],
    0 for a sequence the off-policy mask drops; h: ``token_mask`` [N, T], top_entropy_quantile's tokens; s:
    ``is_weights`` [N, T], the sampler's importance weights. A factor that is None is 1. So 0 means the token moved
    nothing (clipped or masked), 1 an ordinary token, another value an importance-weighted one.
    """
    weights = mask.float()  # [N, T]
    if clipped is not None:
        weights = weights * (~clipped.bool()).float()  # [N, T] x [N, T] or [N, 1]
    for factor in (kept, token_mask, is_weights):
        if factor is not None:
            weights = weights * factor.detach().float()
    return weights.expand_as(mask)  # [N, T]


def policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor | None,
    advantages: torch.Tensor,
    completion_mask: torch.Tensor,
    spec: LossSpec,
    *,
    ref_logprobs: torch.Tensor | None = None,
    num_items_in_batch: int | float | torch.Tensor | None = None,
    sampling_logprobs: torch.Tensor | None = None,
    token_mask: torch.Tensor | None = None,
    weights_out: list | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The registered loss ``spec.loss_type`` with its masks and KL penalty; returns (scalar loss, metrics).

    Per token, with r the importance ratio (see ``importance_log_ratio``), A_i the advantage and l_{i,t} the
    loss's own per-token value (the clipped surrogate -min(r A_i, clip(r, 1 - epsilon, 1 + epsilon_high) A_i) for
    grpo / bnpo / dr_grpo / dapo / luspo; see each loss's module for the others):

        L_{i,t} = l_{i,t} * o_i * h_{i,t} * w_{i,t} + beta * k3_{i,t}
        k3_{i,t} = exp(ref - logp) - (ref - logp) - 1

    where o_i is 0 for a sequence the off-policy mask drops (``spec.off_policy_mask_threshold``), h_{i,t} is
    ``token_mask`` (top_entropy_quantile's high-entropy tokens) and w_{i,t} vLLM's truncated importance weight
    (unless the loss weighs it itself); each factor is 1 when not in use. Then L is reduced to a scalar by the
    loss's aggregation (``grpokit.algos.masked.aggregate``) over ``completion_mask``.
    (Shao et al. 2024 for GRPO; asymmetric "clip-higher" epsilon_high from DAPO, Yu et al. 2025;
    sequence-level ratio from GSPO, Zheng et al. 2025.)

    Args:
        logprobs: [N, T] log-probs of the completion tokens under the policy being trained.
        old_logprobs: [N, T] log-probs under the policy that sampled them; None means on-policy
            (one update per batch), where ``logprobs.detach()`` is used: ratio 1, gradient A grad logp.
        advantages: [N], one per sequence (the GRPO family), or [N, T], one per token (PPO; token-level ratio
            only: A_{i,t} replaces A_i in the formula above).
        completion_mask: [N, T], 1 for real completion tokens (float or bool).
        ref_logprobs: [N, T] log-probs under the reference model; required when ``spec.beta`` > 0.
        num_items_in_batch: completion tokens in the whole generation batch, for the ``dapo`` aggregation.
        sampling_logprobs: [N, T] log-probs reported by a separate sampler (vLLM); when given, each
            token's policy term (not the KL term) is multiplied by
            ``truncated_importance_weights(old_logprobs, sampling_logprobs, spec.sampling_cap)``. The off-policy
            mask measures the drift from them (else from ``old_logprobs``).
        token_mask: [N, T] 0/1, the tokens whose policy term counts (``token_masks.high_entropy_mask``); the KL
            term and the normalisation still cover ``completion_mask``.
        weights_out: a list to which the per-token loss weight [N, T] (float, no gradient; :func:`token_weights`) is
            appended; None: not computed. Nothing else changes.

    Metrics (python floats, named in ``grpokit.algos.names``): the loss's own (the clipped surrogate's
    clip_ratio/low_mean (ratio < 1-eps with A < 0), clip_ratio/high_mean (ratio > 1+eps_high with A > 0),
    clip_ratio/region_mean (either), as fractions of masked tokens, of sequences at sequence level); ratio_mean;
    policy_loss (loss without the KL term); kl (masked mean of k3, only when beta > 0); with sampling log-probs
    sampling_is/weight_mean, sampling_is/capped_fraction and sampling_is/logprob_abs_diff; with the off-policy
    mask off_policy_mask/dropped_fraction.
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
    kind = get_loss(spec.loss_type)
    level = spec.importance_sampling_level
    if old_logprobs is None:
        old_logprobs = logprobs.detach()

    log_weights = importance_log_ratio(logprobs, old_logprobs, completion_mask, level)
    ratio = torch.exp(log_weights)  # [N, T] or [N, 1]
    if not per_token:
        advantages = advantages.unsqueeze(-1)  # [N] -> [N, 1], shared by the sequence's tokens
    is_weights = shaped = None
    if sampling_logprobs is not None:  # the sampler's (behaviour) weights pi_old / mu, offpolicy.behaviour_weights
        shaped = behaviour_weights(
            old_logprobs,
            sampling_logprobs,
            completion_mask,
            spec.sampling_is_mode,
            spec.sampling_is_min,
            spec.sampling_cap,
        )
        is_weights = shaped.weights  # [N, T]
    terms = PolicyTerms(logprobs, logprobs - old_logprobs, ratio, advantages, completion_mask, level, is_weights)
    surrogate, own_metrics = kind.per_token(terms, spec)  # [N, T] or [N, 1]
    surrogate = surrogate.expand_as(logprobs)  # [N, 1] -> [N, T] at sequence level
    if spec.off_policy_mask_threshold is not None:
        drift_from = old_logprobs if sampling_logprobs is None else sampling_logprobs
        kept = off_policy_sequence_mask(
            advantages, logprobs, drift_from, completion_mask, spec.off_policy_mask_threshold
        )  # [N, 1] (or [N, T] with per-token advantages)
        surrogate = surrogate * kept
    if token_mask is not None:
        surrogate = surrogate * token_mask.to(surrogate.dtype)
    if is_weights is not None and not kind.weighs_sampling_itself:
        surrogate = surrogate * is_weights
    if weights_out is not None:
        with torch.no_grad():
            clipped = None if kind.clipped is None else kind.clipped(terms, spec)
            own_weights = is_weights if not kind.weighs_sampling_itself else None
            kept_rows = kept if spec.off_policy_mask_threshold is not None else None
            weights_out.append(token_weights(completion_mask, clipped, kept_rows, token_mask, own_weights))
    aggregation = {"max_completion_length": spec.max_completion_length, "num_items_in_batch": num_items_in_batch}
    pg_loss = aggregate(surrogate, completion_mask, kind.aggregation, **aggregation)  # [N, T] -> []
    loss = pg_loss

    with torch.no_grad():
        metrics = {**own_metrics, RATIO_MEAN: terms.batch_mean(ratio), POLICY_LOSS: pg_loss.item()}
        if shaped is not None:
            metrics.update(weight_metrics(shaped, completion_mask))
            mismatch = torch.nan_to_num(
                old_logprobs - sampling_logprobs, nan=0.0, posinf=0.0, neginf=0.0
            ).abs()  # [N, T]
            metrics[IS_LOGPROB_ABS_DIFF] = masked_mean(mismatch, completion_mask).item()
        if spec.off_policy_mask_threshold is not None:
            metrics[OFF_POLICY_DROPPED] = 1.0 - terms.batch_mean(kept)
    if spec.beta > 0:
        kl = kl_estimate(logprobs, ref_logprobs, "k3")  # [N, T]
        penalty = kl * ratio if spec.use_bias_correction_kl else kl  # [N, T] (ratio [N, 1] at sequence level)
        loss = pg_loss + spec.beta * aggregate(penalty, completion_mask, kind.aggregation, **aggregation)  # []
        metrics[KL] = masked_mean(kl.detach(), completion_mask).item()
    return loss, metrics
