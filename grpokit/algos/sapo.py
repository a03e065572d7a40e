"""SAPO: Soft Adaptive Policy Optimization (Gao et al. 2025, arXiv 2511.20347).

Hard clipping (GRPO's per token, GSPO's per sequence) drops a token's gradient as soon as its ratio leaves
[1 - eps, 1 + eps], and keeps it whole inside. SAPO replaces the clip with a smooth gate of the ratio,

    f(r) = sigmoid(tau (r - 1)) * 4 / tau,    tau = tau_pos if A > 0 else tau_neg,
    J = (1/G) sum_i (1/|o_i|) sum_t f(r_{i,t}) A_{i,t}

(the ``grpo`` aggregation: each sequence's token mean, then the mean over sequences). Its gradient is
f'(r) r A grad log pi with f'(r) r = 4 s (1 - s) r, s = sigmoid(tau (r - 1)): exactly A grad log pi on-policy
(r = 1: 4 * 1/2 * 1/2 = 1), decaying smoothly as r moves away, faster for larger tau. The paper sets
tau_neg > tau_pos (1.05 and 1.0), because pushing a sampled token down spreads probability over many others.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from grpokit.algos.loss_params import SapoParams
from grpokit.algos.loss_registry import LossSettings, register_loss

if TYPE_CHECKING:
    import torch

    from grpokit.algos.losses import LossSpec, PolicyTerms


def _check(settings: LossSettings) -> list[str]:
    for name in ("sapo_temperature_pos", "sapo_temperature_neg"):
        value = getattr(settings.params, name)
        if not value > 0:
            raise ValueError(f"{name}={value} must be > 0 (the slope of sapo's gate; the paper uses 1.0 and 1.05).")
    return []


@register_loss("sapo", aggregation="grpo", check=_check, params=SapoParams)
def sapo_loss(terms: PolicyTerms, spec: LossSpec) -> tuple[torch.Tensor, dict[str, float]]:
    """Per token: l_{i,t} = -f(r) A, f(r) = sigmoid(tau (r - 1)) * 4 / tau, tau = ``sapo_temperature_pos`` of
    ``spec.params`` (:class:`SapoParams`) where A > 0, else ``sapo_temperature_neg``. ``terms.ratio`` [N, T] or
    [N, 1], advantages [N, 1] or [N, T] -> their broadcast shape. No metrics of its own (the ratio mean is
    policy_loss's)."""
    import torch

    ratio, advantages = terms.ratio, terms.advantages
    positive = ratio.new_tensor(spec.params.sapo_temperature_pos)
    negative = ratio.new_tensor(spec.params.sapo_temperature_neg)
    temperature = torch.where(advantages > 0, positive, negative)  # [N, 1] or [N, T]
    gate = torch.sigmoid(temperature * (ratio - 1)) * 4 / temperature
    return -gate * advantages, {}
