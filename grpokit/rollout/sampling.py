"""Next-token sampling: temperature, top-k, top-p, and the log-prob of the sampled token."""

from __future__ import annotations

import torch

from grpokit.rollout.types import SamplingParams


def sample_next(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one token per row.

    logits: [N, V] raw next-token logits. Returns (tokens [N] long, logprobs [N] float32) where the
    log-prob is log softmax(logits / temperature) at the chosen token, before top-k / top-p filtering:
    the same quantity the learner recomputes (as TRL does), so ratio = 1 on-policy.
    """
    scaled = logits.float() / params.temperature  # [N, V]
    logprobs_all = torch.log_softmax(scaled, dim=-1)  # [N, V]
    if params.greedy:
        tokens = scaled.argmax(dim=-1)  # [N]
    else:
        filtered = scaled
        if params.top_k > 0 and params.top_k < filtered.size(-1):
            kth = torch.topk(filtered, params.top_k, dim=-1).values[:, -1:]  # [N, 1]
            filtered = filtered.masked_fill(filtered < kth, float("-inf"))
        if params.top_p < 1.0:
            sorted_logits, order = filtered.sort(dim=-1, descending=True)  # [N, V]
            cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
            # drop a token when the tokens ranked above it already reach top_p; the top token always stays
            drop_sorted = (cumulative - sorted_logits.softmax(dim=-1)) >= params.top_p
            drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
            filtered = filtered.masked_fill(drop, float("-inf"))
        probs = filtered.softmax(dim=-1)  # [N, V]
        tokens = torch.multinomial(probs, 1, generator=generator).squeeze(-1)  # [N]
    return tokens, logprobs_all.gather(-1, tokens[:, None]).squeeze(-1)
