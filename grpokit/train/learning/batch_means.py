"""The update's mean metrics as means over the global batch: every process's tokens (or sequences) counted once.

A loss reports each micro-batch's means (``kl`` over its completion tokens; the clipped fractions over its tokens, or
its sequences at sequence level), and the learner measures the entropy over its own batch's tokens. Weighted by the
counts they were taken over and summed over the micro-batches and the processes, they are the means over the whole
batch, whatever share of its tokens each process holds: one process and two give the same number for the same batch
(TRL's ``global_masked_mean``). A mean of per-process means would weigh a token by how few its process holds.
"""

from __future__ import annotations

import torch

from grpokit.algos.names import LEVEL_MEANS, TOKEN_MEANS

Sums = dict[str, tuple[float, float, float]]  # key -> (sum of values x counts, sum of counts, micro-batches with it)


def part_sums(parts: list[dict], tokens: list[float], sequences: list[float], level: str) -> Sums:
    """Each key of TOKEN_MEANS and LEVEL_MEANS (every one, present or not, so every process reduces the same keys)
    as weighted sums over ``parts``, the micro-batches' metrics; ``tokens`` and ``sequences`` are their counts."""
    level_counts = sequences if level == "sequence" else tokens
    sums = {}
    for key, counts in [(k, tokens) for k in TOKEN_MEANS] + [(k, level_counts) for k in LEVEL_MEANS]:
        found = [(part[key], n) for part, n in zip(parts, counts) if key in part]
        sums[key] = (sum(v * n for v, n in found), sum(n for _, n in found), float(len(found)))
    return sums


def global_means(sums: Sums, procs) -> dict[str, float]:
    """Each key's weighted sum over every process divided by its count over every process; the keys no
    micro-batch of any process reported are left out. One all-reduce; ``sums`` must hold the same keys on
    every process."""
    keys = sorted(sums)
    totals = procs.sum(torch.tensor([sums[k] for k in keys], dtype=torch.float64)).tolist()  # [keys, 3]
    return {k: total / max(count, 1.0) for k, (total, count, seen) in zip(keys, totals) if seen > 0}
