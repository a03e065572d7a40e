"""Masks that leave tokens or sequences out of the policy term: high-entropy tokens, off-policy sequences.

- ``high_entropy_mask`` (Wang et al. 2025, "Beyond the 80/20 Rule", arXiv 2506.01939; TRL's
  ``top_entropy_quantile``): the policy gradient only on the tokens whose entropy is in the top rho of the
  batch's, the "forking" tokens where the model chooses a path.
- ``off_policy_sequence_mask`` (DeepSeek-V3.2, arXiv 2512.02556, eq. 9; TRL's ``off_policy_mask_threshold``):
  drop the sequences with a negative advantage that the policy has drifted far from since they were sampled.
"""

from __future__ import annotations

from collections.abc import Callable

import torch


def quantile(values: torch.Tensor, q: float) -> torch.Tensor:
    """The q-quantile of the 1-D ``values`` with linear interpolation (``torch.quantile``'s default, the same
    numbers), by sorting: no limit on the number of values (``torch.quantile`` refuses more than 2^24)."""
    ordered = values.sort().values  # [n]
    rank = values.new_tensor(q) * (values.numel() - 1)  # in the values' dtype, as torch.quantile computes it
    below = rank.floor()
    low = ordered[below.long()]
    high = ordered[rank.ceil().long()]
    return torch.lerp(low, high, rank - below)


def high_entropy_mask(
    entropies: torch.Tensor,
    mask: torch.Tensor,
    threshold: float,
    gather: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> torch.Tensor:
    """[N, T] bool: the masked tokens whose entropy is at least the ``threshold``-quantile of the masked entropies.

    ``entropies`` [N, T] (no gradient needed), ``mask`` [N, T] 0/1; ``threshold`` in [0, 1] is the quantile level:
    1 - top_entropy_quantile keeps the top rho = top_entropy_quantile of the tokens (0 keeps all of them, 1 only the
    highest). The quantile is taken over every process's tokens: ``gather`` maps this process's 1-D masked
    entropies to every process's, concatenated (None: one process). No masked token anywhere: all False.
    """
    local = entropies[mask.bool()].float()  # [n] this process's tokens
    everyone = local if gather is None else gather(local)  # [n_all]
    if everyone.numel() == 0:
        return torch.zeros_like(entropies, dtype=torch.bool)
    cutoff = quantile(everyone, threshold)
    return ((entropies * mask.float()) >= cutoff) & mask.bool()  # [N, T]; padding never kept


def off_policy_sequence_mask(
    advantages: torch.Tensor,
    logprobs: torch.Tensor,
    sampling_logprobs: torch.Tensor,
    mask: torch.Tensor,
    threshold: float,
) -> torch.Tensor:
    """[N, 1] in ``mask``'s dtype: 1 keeps a sequence, 0 drops it from the policy term.

    KL_i = (1/|o_i|) sum_t m_{i,t} (log mu(o_{i,t}) - log pi(o_{i,t})), the mean per-token log-ratio between the
    sampling policy mu (``sampling_logprobs`` [N, T]) and the current one (``logprobs`` [N, T], no gradient), a
    sample estimate of KL(mu || pi). Keep i when A_i >= 0 or KL_i <= ``threshold``: a sequence with a negative
    advantage that the policy has drifted away from is a poor signal of what to unlearn. A token whose sampling
    log-prob is NaN (not reported) counts as no drift. ``advantages`` [N], [N, 1] or [N, T] (then the result is
    [N, T]).
    """
    drift = torch.nan_to_num(sampling_logprobs - logprobs.detach(), nan=0.0)  # [N, T]
    mean_drift = (drift * mask).sum(dim=1, keepdim=True) / mask.sum(dim=1, keepdim=True).clamp(min=1.0)  # [N, 1]
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(-1)  # [N] -> [N, 1]
    return ((advantages >= 0) | (mean_drift <= threshold)).to(dtype=mask.dtype)
