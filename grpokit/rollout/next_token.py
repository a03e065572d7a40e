"""Next-token sampling: temperature, min-p, top-k, top-p, and the log-prob of the sampled token.

This runs once per decoded token on [N, V] logits, so each full pass over the vocabulary counts
(at V = 32,000 one pass is ~1-2 ms on a CPU core, as much as a layer of a small model): one fused
softmax gives both the sampling weights and the chosen token's log-prob, and the draw uses one
uniform number per row (:func:`inverse_cdf`) instead of V exponential ones (torch.multinomial,
~25-50 ms per [32, 32000] draw on this kind of CPU).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from grpokit.rollout.types import SamplingParams

# Vocabulary entries per block of the two-level inverse CDF.
_BLOCK = 256


Generators = torch.Generator | Sequence[torch.Generator] | None


def sample_next(
    logits: torch.Tensor, params: SamplingParams, generator: Generators, processed: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one token per row (filters in vLLM's order: min-p, then top-k, then top-p).

    ``generator``: one for the batch, or one per row (each row's draw then depends only on its own stream, not on
    which other rows share the batch: what multi-turn rollouts need, whose batches change with tool timing).

    logits: [N, V] raw next-token logits; ``processed``: the same after the logits processors (repetition penalty,
    banned tokens: :class:`grpokit.rollout.logits_rules.LogitsRules`), which the draw uses instead. Returns
    (tokens [N] long, logprobs [N] float32) where the log-prob is log softmax(logits / temperature) at the chosen
    token, before the processors and the top-k / top-p filters: the same quantity the learner recomputes (as TRL
    does), so ratio = 1 on-policy.
    """
    scaled = logits if params.temperature == 1.0 else logits.float() / params.temperature  # [N, V]
    probs = torch.softmax(scaled, dim=-1, dtype=torch.float32)  # [N, V]
    drawn = probs  # what the draw weighs: the model's probabilities, or those after the processors
    if processed is not None:
        drawn = torch.softmax(processed / params.temperature, dim=-1, dtype=torch.float32)  # [N, V]
    if params.greedy:
        tokens = drawn.argmax(dim=-1)  # [N]
    else:
        weights = drawn
        if params.min_p > 0:  # as vLLM: min-p first, on the probabilities at the sampling temperature
            weights = weights.masked_fill(weights < params.min_p * weights.amax(dim=-1, keepdim=True), 0.0)
        if params.top_k > 0 and params.top_k < weights.size(-1):
            kth = torch.topk(weights, params.top_k, dim=-1).values[:, -1:]  # [N, 1]
            weights = weights.masked_fill(weights < kth, 0.0)
        if params.top_p < 1.0:
            sorted_weights, order = weights.sort(dim=-1, descending=True)  # [N, V]
            sorted_probs = sorted_weights / sorted_weights.sum(dim=-1, keepdim=True)
            # drop a token when the tokens ranked above it already reach top_p; the top token always stays
            drop_sorted = (sorted_probs.cumsum(dim=-1) - sorted_probs) >= params.top_p
            weights = weights.masked_fill(torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted), 0.0)
        tokens = inverse_cdf(weights, generator)  # [N]
    # log of the float32 probability: within ~1e-7 of log_softmax, and one pass over V cheaper
    return tokens, probs.gather(-1, tokens[:, None]).squeeze(-1).log()


def inverse_cdf(weights: torch.Tensor, generator: Generators) -> torch.Tensor:
    """One index per row of ``weights`` [N, V] (>= 0, not necessarily normalised), index j drawn with
    probability w_j / sum(w).

    Inverse transform sampling with one uniform u ~ U[0, total) per row: the answer is the first j
    whose cumulative weight exceeds u. A float32 running sum over V = 32,000 entries would blur the
    interval of each token by up to ulp(1) ~ 6e-8, which is ~0.2 % of a 1/V probability; so the sum
    is two-level and in float64: per-block sums (float32 over 256 entries, exact to ~1e-7 relative),
    a float64 cumulative sum over blocks picks the block, a float64 cumulative sum inside it picks
    the entry. Only entries with positive weight can be drawn (the search is for a strictly larger
    cumulative weight, and u is kept below each total).
    """
    N, V = weights.shape
    full = V - V % _BLOCK  # the last block may be shorter: summed on its own, not padded (a copy of [N, V] per token)
    block_sums = weights[:, :full].reshape(N, -1, _BLOCK).sum(-1)  # [N, K]
    if full < V:
        block_sums = torch.cat([block_sums, weights[:, full:].sum(-1, keepdim=True)], dim=1)  # [N, K + 1]
    block_cdf = block_sums.double().cumsum(-1)  # [N, K]
    total = block_cdf[:, -1:]  # [N, 1]
    if not bool(torch.isfinite(total).all() and (total > 0).all()):
        raise ValueError("cannot sample: a row of next-token logits is NaN/inf or has no token left after top-k/top-p")
    u = _uniforms(N, generator, weights.device) * total  # [N, 1]
    u = torch.minimum(u, torch.nextafter(total, torch.zeros_like(total)))
    block = torch.searchsorted(block_cdf, u, right=True)  # [N, 1] first block whose cdf > u
    before = torch.where(block > 0, block_cdf.gather(-1, (block - 1).clamp(min=0)), torch.zeros_like(u))  # [N, 1]
    columns = block * _BLOCK + torch.arange(_BLOCK, device=weights.device)  # [N, b] the chosen block's entries
    inside = columns < V
    entries = weights.gather(-1, columns.clamp(max=V - 1)).masked_fill(~inside, 0.0)  # [N, b], zero past V
    inner_cdf = entries.double().cumsum(-1)  # [N, b]
    last = inner_cdf[:, -1:]
    rest = torch.minimum(
        u - before, torch.nextafter(last, torch.zeros_like(last))
    )  # [N, 1], rounding kept inside the block
    index = torch.searchsorted(inner_cdf, rest, right=True)  # [N, 1]
    return (block * _BLOCK + index).squeeze(-1)  # [N]


def _uniforms(rows: int, generator: Generators, device: torch.device) -> torch.Tensor:
    """[rows, 1] float64 uniforms in [0, 1): from one generator, or one from each row's generator."""
    if generator is None or isinstance(generator, torch.Generator):
        return torch.rand((rows, 1), generator=generator, dtype=torch.float64, device=device)
    if len(generator) != rows:
        raise ValueError(f"{len(generator)} generators for {rows} rows")
    return torch.cat([torch.rand((1, 1), generator=g, dtype=torch.float64, device=device) for g in generator])
