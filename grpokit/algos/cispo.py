"""CISPO: the clipped importance-sampling-weight policy loss of MiniMax-M1 (arXiv 2506.13585).

PPO and GRPO clip the token *update*: a token whose ratio leaves the trust region gets no gradient at all,
which in long reasoning traces silences the rare, low-probability "fork" tokens. CISPO clips the importance
*weight* instead and stops its gradient, so every token keeps a REINFORCE gradient, only its weight is
bounded:

    J = 1 / sum_i |o_i| * sum_i sum_t sg(min(r_{i,t}, epsilon_max)) A_{i,t} log pi(o_{i,t} | q, o_{i,<t})

normalised by the generation batch's tokens (the ``dapo`` aggregation). The paper writes the bound as
clip(r, 1 - eps_low, 1 + eps_high) and leaves the lower end open in practice; as in TRL (and ScaleRL, arXiv
2510.13786, which names it epsilon_max, recommended 5.0), the cap is ``epsilon_high`` itself, not 1 + epsilon_high.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from grpokit.algos.clipped import sequence_level_advice
from grpokit.algos.loss_registry import LossSettings, register_loss
from grpokit.algos.names import CISPO_CLIP

if TYPE_CHECKING:
    import torch

    from grpokit.algos.losses import LossSpec, PolicyTerms


def _advice(settings: LossSettings) -> list[str]:
    cap = settings.epsilon if settings.epsilon_high is None else settings.epsilon_high
    advice = sequence_level_advice(settings)
    if cap < 1:
        advice.append(
            f"loss_type: cispo caps each token's importance weight at epsilon_high itself (ScaleRL's epsilon_max, as "
            f"TRL reads it), here {cap}: below 1 every on-policy token is weighted {cap} instead of 1; set "
            "epsilon_high (ScaleRL recommends 5.0)."
        )
    return advice


@register_loss("cispo", aggregation="dapo", check=_advice)
def cispo_loss(terms: PolicyTerms, spec: LossSpec) -> tuple[torch.Tensor, dict[str, float]]:
    """Per token: l_{i,t} = -sg(min(r, epsilon_max)) A log pi_{i,t}, epsilon_max = ``spec.upper_epsilon``.

    ``terms.ratio`` [N, T] (or [N, 1] at sequence level), advantages [N, 1] or [N, T], log-probs [N, T] -> [N, T].
    The gradient is sg(min(r, epsilon_max)) A grad log pi for every token (none is dropped); on-policy (r = 1, a cap
    >= 1) it is the plain policy gradient A grad log pi.

    Metric: cispo_clip_ratio, the fraction of masked tokens (sequences at sequence level) with r > epsilon_max and
    A > 0 (TRL's: tokens whose weight the cap lowered while they were being reinforced).
    """
    import torch

    cap = spec.upper_epsilon
    weights = torch.clamp(terms.ratio, max=cap).detach()  # [N, T] or [N, 1]
    per_token = -weights * terms.advantages * terms.logprobs  # [N, T]
    with torch.no_grad():
        capped = (terms.ratio > cap) & (terms.advantages > 0)
        metrics = {CISPO_CLIP: terms.batch_mean(capped)}
    return per_token, metrics
