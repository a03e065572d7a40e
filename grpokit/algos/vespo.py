"""VESPO: Variational sEquence-level Soft Policy Optimization (Shen et al. 2026, arXiv 2602.10693).

Off-policy samples (stale rollouts, a sampler that differs from the learner) need importance weights, whose
variance explodes over long sequences; clipping per token or normalising by length trades that for bias
without a principle. VESPO derives, from a variational problem with a variance budget, a closed-form kernel
on the *sequence* importance weight w = pi(o) / mu(o) (the product over tokens, no length normalisation):

    phi(w) = w^k exp(lambda (1 - w)) = e^lambda w^k e^(-lambda w)      (phi(1) = 1)

a Gamma-shaped weight that vanishes as w -> 0 (power k) and as w -> infinity (decay lambda), with its own (k,
lambda) for A >= 0 and for A < 0. phi is a fixed coefficient (no gradient) on the REINFORCE gradient:

    J = 1 / sum_i |o_i| * sum_i sum_t phi(w_i) A_i log pi(o_{i,t} | q, o_{i,<t})

normalised by the generation batch's tokens (the ``dapo`` aggregation). With vLLM's log-probs the sampler's
truncated token weights join w (mu is then the sampler), instead of multiplying the per-token loss.
The log-space clamps below (per-token log-ratio within +-20, log w within [log 1e-8, 20], lambda >= 1e-4, a
non-finite phi -> 0) are those of the authors' code and TRL's, keeping w's exponentials finite.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from grpokit.algos.loss_params import VespoParams
from grpokit.algos.loss_registry import LossSettings, register_loss
from grpokit.algos.names import VESPO_PHI

if TYPE_CHECKING:
    import torch

    from grpokit.algos.losses import LossSpec, PolicyTerms

LOG_W_MIN = math.log(1e-8)
LOG_W_MAX = 20.0


def _advice(settings: LossSettings) -> list[str]:
    for name in ("vespo_k_pos", "vespo_lambda_pos", "vespo_k_neg", "vespo_lambda_neg"):
        value = getattr(settings.params, name)
        if not value >= 0:
            raise ValueError(
                f"{name}={value} must be >= 0 (vespo's kernel w^k exp(lambda (1 - w)) is bounded only for k, lambda >= "
                "0; the paper's defaults are k 2 / 3 and lambda 3 / 2 for A >= 0 / A < 0)."
            )
    if settings.importance_sampling_level == "token":
        return []
    return [
        "loss_type: vespo computes its own sequence-level weight from the per-token ratios; "
        "importance_sampling_level: sequence only changes the KL term's bias correction: set "
        "importance_sampling_level: token."
    ]


def gamma_weights(
    log_ratio: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    spec: LossSpec,
    sampling_weights: torch.Tensor | None = None,
) -> torch.Tensor:
    """phi(w_i) per sequence, [N, 1] (or [N, T] with per-token advantages), no gradient.

    log w_i = sum_t m_{i,t} clamp(log r_{i,t}, -20, 20) (+ sum_t m_{i,t} log(sampling weight)), clamped to
    [log 1e-8, 20]; (k, lambda) = (vespo_k_pos, vespo_lambda_pos) where A >= 0, else the _neg pair; lambda >= 1e-4;
    phi = exp(lambda + k log w - lambda w), non-finite -> 0. ``log_ratio`` [N, T] logp - old_logp, ``advantages``
    [N, 1] or [N, T], ``mask`` [N, T], ``sampling_weights`` [N, T] vLLM's truncated token weights or None.
    """
    import torch

    with torch.no_grad():
        log_w = (torch.clamp(log_ratio, -20.0, 20.0) * mask).sum(dim=-1, keepdim=True)  # [N, 1]
        if sampling_weights is not None:  # w = pi / mu_sampler = (pi / pi_old) (pi_old / mu_sampler)
            log_sampling = torch.clamp(torch.log(sampling_weights), LOG_W_MIN, LOG_W_MAX)  # [N, T]
            log_w = log_w + (log_sampling * mask).sum(dim=-1, keepdim=True)  # padding counts as weight 1
        log_w = torch.clamp(log_w, LOG_W_MIN, LOG_W_MAX)  # [N, 1]
        nonnegative = advantages >= 0  # [N, 1] or [N, T]
        params = spec.params  # VespoParams
        k = torch.where(nonnegative, log_w.new_tensor(params.vespo_k_pos), log_w.new_tensor(params.vespo_k_neg))
        lam = torch.where(
            nonnegative, log_w.new_tensor(params.vespo_lambda_pos), log_w.new_tensor(params.vespo_lambda_neg)
        )
        lam = lam.clamp(min=1e-4)
        log_phi = lam + k * log_w - lam * torch.exp(log_w)
        return torch.exp(log_phi).nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)


@register_loss("vespo", aggregation="dapo", weighs_sampling_itself=True, check=_advice, params=VespoParams)
def vespo_loss(terms: PolicyTerms, spec: LossSpec) -> tuple[torch.Tensor, dict[str, float]]:
    """Per token: l_{i,t} = -phi(w_i) A log pi_{i,t} (``gamma_weights``); log-probs [N, T] -> [N, T]. Its gradient
    is phi(w_i) A grad log pi, for every token of the sequence alike. Reads the per-token log-ratio, whatever the
    importance_sampling_level. Metric: vespo/phi_seq_mean, the mean of phi over sequences."""
    phi = gamma_weights(terms.log_ratio, terms.advantages, terms.mask, spec, terms.sampling_weights)
    per_token = -phi * terms.advantages * terms.logprobs  # [N, T]
    return per_token, {VESPO_PHI: terms.batch_mean(phi)}
