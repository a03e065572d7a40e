"""Masked reductions over completion tokens and the loss aggregations built from them.

Shapes: N sequences (N = B*G), T completion tokens. ``mask`` is 1 for a real completion token and
0 for padding (float or bool); it is cast to the dtype of ``values`` so gradients flow through
``values`` only.
"""

from __future__ import annotations

import torch

from grpokit.algos.names import AGGREGATIONS


def masked_sum(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Sum of ``values * mask`` over ``dim`` (all elements when ``dim`` is None)."""
    masked = values * mask.to(values.dtype)  # same shape as values
    return masked.sum() if dim is None else masked.sum(dim)  # [] or values with dim removed


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of ``values`` over the masked elements along ``dim`` (all elements when None).

    The count is clamped to 1, so a fully masked-out row gives 0 rather than NaN (as TRL does).
    """
    count = mask.to(values.dtype)  # same shape as mask
    count = count.sum() if dim is None else count.sum(dim)  # [] or mask with dim removed
    return masked_sum(values, mask, dim) / count.clamp(min=1.0)


def aggregate(
    values: torch.Tensor,
    mask: torch.Tensor,
    mode: str,
    *,
    num_items_in_batch: int | float | torch.Tensor | None = None,
    max_completion_length: int | None = None,
) -> torch.Tensor:
    """Reduce per-token values [N, T] to a scalar loss, by aggregation name (``names.AGGREGATIONS``, each named
    after the loss type that introduced it; a registered loss names its own, see ``loss_registry``).

    With L_{i,t} the per-token value, m_{i,t} the mask and |o_i| = sum_t m_{i,t}:

    - ``grpo`` (Shao et al. 2024, DeepSeekMath): (1/N) sum_i (1/|o_i|) sum_t m L
      (each sequence weighs the same, whatever its length).
    - ``bnpo``: sum_{i,t} m L / sum_{i,t} m (each token of this batch weighs the same).
    - ``dapo`` (Yu et al. 2025, DAPO): sum_{i,t} m L / num_items_in_batch, where
      ``num_items_in_batch`` is the number of completion tokens in the whole generation batch, so
      the losses of its micro-batches add up to the token mean over the whole batch. Without it,
      the same as ``bnpo``. Under data parallelism, where gradients are averaged over P
      processes, pass the global token count divided by P (as TRL does).
    - ``dr_grpo`` (Liu et al. 2025, "Understanding R1-Zero-Like Training"):
      sum_{i,t} m L / (N * max_completion_length), a constant normaliser free of length bias.
    - ``luspo`` (Liu et al. 2026, LUSPO): (1/N) sum_i sum_t m L (each sequence's token sum: a sequence
      weighs by its length).

    These match TRL's GRPOTrainer (per process and per gradient-accumulation step).
    """
    if mode not in AGGREGATIONS:
        raise ValueError(f"unknown aggregation {mode!r}; valid choices: {', '.join(AGGREGATIONS)}")
    if mode == "luspo":
        return masked_sum(values, mask, dim=-1).mean()  # [N, T] -> [N] -> []
    if mode == "grpo":
        per_sequence = masked_mean(values, mask, dim=-1)  # [N, T] -> [N]
        return per_sequence.mean()  # [N] -> []
    if mode == "bnpo" or (mode == "dapo" and num_items_in_batch is None):
        return masked_mean(values, mask)  # [N, T] -> []
    if mode == "dapo":
        return masked_sum(values, mask) / num_items_in_batch  # [N, T] -> []
    if max_completion_length is None:
        raise ValueError("loss_type 'dr_grpo' needs max_completion_length (the generation limit, in tokens)")
    return masked_sum(values, mask) / (values.shape[0] * max_completion_length)  # [N, T] -> []


def chunk_share(mode: str, chunk_mask: torch.Tensor, mask: torch.Tensor, *, num_items_in_batch: object = None) -> float:
    """The weight of a chunk of rows in the aggregate of the whole they come from: for any split of the rows of
    ``values`` [N, T] into chunks, ``aggregate(values, mask, mode) == sum_c share_c * aggregate(values_c, mask_c,
    mode)`` (same keywords). ``chunk_mask`` [N_c, T], ``mask`` [N, T].

    - ``grpo``, ``luspo``, ``dr_grpo``: means over the sequences (dr_grpo's over sequences x
      max_completion_length): share = N_c / N.
    - ``bnpo`` (and ``dapo`` without ``num_items_in_batch``): the mean over the whole's tokens: share = |m_c| / |m|,
      with |m| clamped to 1 as :func:`masked_mean` clamps it.
    - ``dapo``: each chunk is already divided by the generation batch's token count: share = 1.
    """
    if mode not in AGGREGATIONS:
        raise ValueError(f"unknown aggregation {mode!r}; valid choices: {', '.join(AGGREGATIONS)}")
    if mode == "dapo" and num_items_in_batch is not None:
        return 1.0
    if mode == "bnpo" or mode == "dapo":
        return float(chunk_mask.sum()) / max(float(mask.sum()), 1.0)
    return chunk_mask.shape[0] / mask.shape[0]
