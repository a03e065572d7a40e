"""Advice on combining a sequence-level importance ratio with a loss that sums tokens (TRL's warning, same words).

GSPO (``importance_sampling_level: sequence``) optimises a per-sequence objective; a loss whose aggregation sums
per-token terms over the batch (bnpo, dr_grpo, dapo and cispo's) weights each sequence by its length instead.
"""

from __future__ import annotations

# aggregations that add up per-token terms rather than averaging each sequence (names.AGGREGATIONS)
TOKEN_SUMMED = ("bnpo", "dr_grpo", "dapo")


def sequence_level_warning(importance_sampling_level: str, loss_type: str, aggregation: str) -> str | None:
    """TRL's warning text when ``importance_sampling_level`` is sequence and the loss sums tokens, else None.
    vespo weighs whole sequences itself (its sequence level is refused elsewhere), so it gets none."""
    if importance_sampling_level != "sequence" or aggregation not in TOKEN_SUMMED or loss_type == "vespo":
        return None
    return (
        f"When using `importance_sampling_level='sequence'`, the `'{loss_type}'` loss sums per-token "
        "contributions, which effectively weights each sequence by its completion length instead of "
        "optimizing the per-sequence objective. To reproduce the GSPO paper's setup, set `loss_type='grpo'` "
        "(see https://huggingface.co/docs/trl/main/en/paper_index#group-sequence-policy-optimization)."
    )
