"""Log-probs of chosen tokens and entropies from logits, without materialising a full softmax.

logits [..., T, V] (usually [N, T, V]) are processed ``chunk_size`` rows (positions) at a time.
A naive ``log_softmax(logits).gather(...)`` keeps a float32 [N, T, V] tensor alive for backward;
here each chunk's softmax is recomputed in backward instead (a custom autograd Function), so only
[chunk_size, V] temporaries exist at any time, and the memory held for backward is the logits
themselves plus one float per position.

float32/float64 logits are reduced in their own dtype as logit[token] - logsumexp(logits);
bf16/fp16 chunks are upcast to float32 first, and the results are float32.
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

# Rows per chunk when not given: about 2**24 logits (64 MiB in float32) per chunk.
_CHUNK_ELEMENTS = 2**24


def _result_dtype(dtype: torch.dtype) -> torch.dtype:
    return dtype if dtype in (torch.float32, torch.float64) else torch.float32


def _rows_per_chunk(vocab_size: int, chunk_size: int | None) -> int:
    if chunk_size is not None:
        if chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
        return chunk_size
    return max(1, _CHUNK_ELEMENTS // vocab_size)


def _scaled_chunk(rows: torch.Tensor, start: int, stop: int, temperature: float) -> torch.Tensor:
    chunk = rows[start:stop].to(_result_dtype(rows.dtype))  # [c, V]
    return chunk if temperature == 1.0 else chunk / temperature


class _SelectiveLogprobs(torch.autograd.Function):
    """log p(token) = x[token] - logsumexp(x), x = logits / temperature.

    d/dx_j = 1[j = token] - softmax(x)_j, times 1/temperature for the logits.
    """

    @staticmethod
    def forward(ctx, logits, token_ids, temperature, rows_per_chunk):
        rows = logits.reshape(-1, logits.shape[-1])  # [..., T, V] -> [R, V]
        ids = token_ids.reshape(-1, 1)  # [..., T] -> [R, 1]
        logsumexp = torch.empty(rows.shape[0], dtype=_result_dtype(logits.dtype), device=logits.device)  # [R]
        selected = torch.empty_like(logsumexp)  # [R]
        for start in range(0, rows.shape[0], rows_per_chunk):
            stop = start + rows_per_chunk
            x = _scaled_chunk(rows, start, stop, temperature)  # [c, V]
            logsumexp[start:stop] = torch.logsumexp(x, dim=-1)  # [c, V] -> [c]
            selected[start:stop] = x.gather(-1, ids[start:stop]).squeeze(-1) - logsumexp[start:stop]  # [c]
        ctx.save_for_backward(logits, token_ids, logsumexp)
        ctx.temperature, ctx.rows_per_chunk = temperature, rows_per_chunk
        return selected.view(token_ids.shape)  # [R] -> [..., T]

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_output):
        logits, token_ids, logsumexp = ctx.saved_tensors
        rows = logits.reshape(-1, logits.shape[-1])  # [..., T, V] -> [R, V]
        ids = token_ids.reshape(-1, 1)  # [..., T] -> [R, 1]
        upstream = grad_output.reshape(-1, 1).to(logsumexp.dtype)  # [..., T] -> [R, 1]
        grad_rows = torch.empty_like(rows)  # [R, V]
        for start in range(0, rows.shape[0], ctx.rows_per_chunk):
            stop = start + ctx.rows_per_chunk
            x = _scaled_chunk(rows, start, stop, ctx.temperature)  # [c, V]
            grad = -torch.exp(x - logsumexp[start:stop, None]) * upstream[start:stop]  # [c, V]
            grad.scatter_add_(-1, ids[start:stop], upstream[start:stop])
            grad_rows[start:stop] = grad / ctx.temperature
        return grad_rows.view_as(logits), None, None, None


class _Entropy(torch.autograd.Function):
    """H = logsumexp(x) - sum_j p_j x_j with p = softmax(x), x = logits / temperature.

    dH/dx_j = -p_j (x_j - sum_k p_k x_k), times 1/temperature for the logits.
    """

    @staticmethod
    def forward(ctx, logits, temperature, rows_per_chunk):
        rows = logits.reshape(-1, logits.shape[-1])  # [..., T, V] -> [R, V]
        logsumexp = torch.empty(rows.shape[0], dtype=_result_dtype(logits.dtype), device=logits.device)  # [R]
        mean_logit = torch.empty_like(logsumexp)  # [R]
        for start in range(0, rows.shape[0], rows_per_chunk):
            stop = start + rows_per_chunk
            x = _scaled_chunk(rows, start, stop, temperature)  # [c, V]
            logsumexp[start:stop] = torch.logsumexp(x, dim=-1)  # [c, V] -> [c]
            probs = torch.exp(x - logsumexp[start:stop, None])  # [c, V]
            mean_logit[start:stop] = (probs * x).sum(-1)  # [c, V] -> [c]
        ctx.save_for_backward(logits, logsumexp, mean_logit)
        ctx.temperature, ctx.rows_per_chunk = temperature, rows_per_chunk
        return (logsumexp - mean_logit).view(logits.shape[:-1])  # [R] -> [..., T]

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_output):
        logits, logsumexp, mean_logit = ctx.saved_tensors
        rows = logits.reshape(-1, logits.shape[-1])  # [..., T, V] -> [R, V]
        upstream = grad_output.reshape(-1, 1).to(logsumexp.dtype)  # [..., T] -> [R, 1]
        grad_rows = torch.empty_like(rows)  # [R, V]
        for start in range(0, rows.shape[0], ctx.rows_per_chunk):
            stop = start + ctx.rows_per_chunk
            x = _scaled_chunk(rows, start, stop, ctx.temperature)  # [c, V]
            probs = torch.exp(x - logsumexp[start:stop, None])  # [c, V]
            grad = -probs * (x - mean_logit[start:stop, None]) * upstream[start:stop]  # [c, V]
            grad_rows[start:stop] = grad / ctx.temperature
        return grad_rows.view_as(logits), None, None


def selective_logprobs(
    logits: torch.Tensor, token_ids: torch.Tensor, temperature: float = 1.0, chunk_size: int | None = None
) -> torch.Tensor:
    """log softmax(logits / temperature)[token_ids], [..., T, V] x [..., T] -> [..., T].

    Differentiable in ``logits``. ``chunk_size`` is the number of positions per chunk (default:
    about 2**24 logits per chunk); results do not depend on it.
    """
    if token_ids.shape != logits.shape[:-1]:
        raise ValueError(f"token_ids shape {tuple(token_ids.shape)} does not match logits {tuple(logits.shape)}")
    rows_per_chunk = _rows_per_chunk(logits.shape[-1], chunk_size)
    return _SelectiveLogprobs.apply(logits, token_ids.long(), float(temperature), rows_per_chunk)


def entropy_from_logits(
    logits: torch.Tensor, temperature: float = 1.0, chunk_size: int | None = None
) -> torch.Tensor:
    """Entropy of softmax(logits / temperature) per position, [..., T, V] -> [..., T].

    H = -sum_j p_j log p_j = logsumexp(x) - sum_j p_j x_j. Differentiable in ``logits``; logits
    must be finite (a -inf logit gives 0 * -inf = NaN).
    """
    rows_per_chunk = _rows_per_chunk(logits.shape[-1], chunk_size)
    return _Entropy.apply(logits, float(temperature), rows_per_chunk)
