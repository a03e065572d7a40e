"""LUSPO: Length-Unbiased Sequence Policy Optimization (Liu et al. 2026, arXiv 2602.05261).

GSPO (sequence-level ratio, ``importance_sampling_level: sequence``) averages each sequence's loss over its
tokens and then over sequences, so every sequence weighs the same whatever its length; the paper shows this
biases training towards short responses (their length collapses). LUSPO scales each sequence's loss by its
length |o_i|:

    J = (1/G) sum_i |o_i| min(s_i A_i, clip(s_i, 1 - eps, 1 + eps_high) A_i),
    s_i = exp((1/|o_i|) sum_t log(pi / pi_old))   (GSPO's ratio)

i.e. the clipped surrogate (clipped.py) with the ``luspo`` aggregation: each sequence's token *sum*, then the mean
over sequences.
"""

from __future__ import annotations

from grpokit.algos.clipped import clipped_surrogate, clipped_tokens
from grpokit.algos.loss_registry import LossSettings, register_loss


def _advice(settings: LossSettings) -> list[str]:
    if settings.importance_sampling_level == "sequence":
        return []
    return [
        "loss_type: luspo is GSPO's sequence-level loss scaled by length; with importance_sampling_level: "
        f"{settings.importance_sampling_level} it is not the paper's setup: set importance_sampling_level: sequence."
    ]


@register_loss("luspo", aggregation="luspo", check=_advice, clipped=clipped_tokens)
def luspo_surrogate(terms, spec):
    """The clipped surrogate, which luspo's aggregation (each sequence's token sum, averaged) scales by length."""
    return clipped_surrogate(terms, spec)
