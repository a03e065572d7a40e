"""Log-probs of chosen tokens and entropies from logits, without materialising a full softmax.

logits [..., T, V] (usually [N, T, V]) are processed in tiles of about ``chunk_size`` positions
(whole sequences when a sequence fits, else pieces of one sequence). A naive
``log_softmax(logits).gather(...)`` keeps a float32 [N, T, V] tensor alive for backward; here
each tile's softmax is recomputed in backward instead (a custom autograd Function), so only
tile-sized [.., V] temporaries exist at any time and the memory held for backward is the logits
themselves plus one float per position. Tiles are views, so non-contiguous logits (such as
``out.logits[:, :-1]``) are never copied whole.

float32/float64 logits are reduced in their own dtype as logit[token] - logsumexp(logits);
bf16/fp16 tiles are upcast to float32 first, and the results are float32.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch.autograd.function import once_differentiable

# Positions per tile when chunk_size is not given: about 2**24 logits (64 MiB in float32).
_CHUNK_ELEMENTS = 2**24

Tile = tuple[slice, slice]


def _result_dtype(dtype: torch.dtype) -> torch.dtype:
    return dtype if dtype in (torch.float32, torch.float64) else torch.float32


def _positions_per_tile(vocab_size: int, chunk_size: int | None) -> int:
    if chunk_size is not None:
        if chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
        return chunk_size
    return max(1, _CHUNK_ELEMENTS // vocab_size)


def _as_3d(logits: torch.Tensor) -> torch.Tensor:
    if logits.dim() == 2:
        return logits.unsqueeze(0)  # [T, V] -> [1, T, V]
    return logits.flatten(0, -3)  # [..., T, V] -> [P, T, V]


def _tiles(sequences: int, length: int, positions: int) -> Iterator[Tile]:
    """(sequence slice, position slice) tiles of at most ``positions`` positions each."""
    per_tile = max(1, positions // length)
    span = min(length, positions)
    for start in range(0, sequences, per_tile):
        for offset in range(0, length, span):
            yield slice(start, start + per_tile), slice(offset, offset + span)


def _scaled(logits: torch.Tensor, tile: Tile, temperature: float) -> torch.Tensor:
    x = logits[tile].to(_result_dtype(logits.dtype))  # [s, t, V]
    return x if temperature == 1.0 else x / temperature


class _SelectiveLogprobs(torch.autograd.Function):
    """log p(token) = x[token] - logsumexp(x), x = logits / temperature.

    d/dx_j = 1[j = token] - softmax(x)_j, times 1/temperature for the logits.
    """

    @staticmethod
    def forward(ctx, logits, token_ids, temperature, positions):
        tiled = _as_3d(logits)  # [P, T, V]
        ids = token_ids.reshape(tiled.shape[:-1]).unsqueeze(-1)  # [..., T] -> [P, T, 1]
        logsumexp = torch.empty(tiled.shape[:-1], dtype=_result_dtype(logits.dtype), device=logits.device)  # [P, T]
        selected = torch.empty_like(logsumexp)  # [P, T]
        for tile in _tiles(tiled.shape[0], tiled.shape[1], positions):
            x = _scaled(tiled, tile, temperature)  # [s, t, V]
            logsumexp[tile] = torch.logsumexp(x, dim=-1)  # [s, t, V] -> [s, t]
            selected[tile] = x.gather(-1, ids[tile]).squeeze(-1) - logsumexp[tile]  # [s, t, V] -> [s, t]
        ctx.save_for_backward(logits, token_ids, logsumexp)
        ctx.temperature, ctx.positions = temperature, positions
        return selected.view(token_ids.shape)  # [P, T] -> [..., T]

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_output):
        logits, token_ids, logsumexp = ctx.saved_tensors
        tiled = _as_3d(logits)  # [P, T, V]
        ids = token_ids.reshape(tiled.shape[:-1]).unsqueeze(-1)  # [..., T] -> [P, T, 1]
        upstream = grad_output.reshape(tiled.shape[:-1]).unsqueeze(-1).to(logsumexp.dtype)  # [..., T] -> [P, T, 1]
        grad_logits = torch.empty(logits.shape, dtype=logits.dtype, device=logits.device)  # [..., T, V]
        grad_tiled = _as_3d(grad_logits)  # [P, T, V], a view: grad_logits is contiguous
        for tile in _tiles(tiled.shape[0], tiled.shape[1], ctx.positions):
            x = _scaled(tiled, tile, ctx.temperature)  # [s, t, V]
            grad = -torch.exp(x - logsumexp[tile].unsqueeze(-1)) * upstream[tile]  # [s, t, V]
            grad.scatter_add_(-1, ids[tile], upstream[tile])
            grad_tiled[tile] = grad / ctx.temperature
        return grad_logits, None, None, None


class _Entropy(torch.autograd.Function):
    """H = logsumexp(x) - sum_j p_j x_j with p = softmax(x), x = logits / temperature.

    dH/dx_j = -p_j (x_j - sum_k p_k x_k), times 1/temperature for the logits.
    """

    @staticmethod
    def forward(ctx, logits, temperature, positions):
        tiled = _as_3d(logits)  # [P, T, V]
        logsumexp = torch.empty(tiled.shape[:-1], dtype=_result_dtype(logits.dtype), device=logits.device)  # [P, T]
        mean_logit = torch.empty_like(logsumexp)  # [P, T]
        for tile in _tiles(tiled.shape[0], tiled.shape[1], positions):
            x = _scaled(tiled, tile, temperature)  # [s, t, V]
            logsumexp[tile] = torch.logsumexp(x, dim=-1)  # [s, t, V] -> [s, t]
            probs = torch.exp(x - logsumexp[tile].unsqueeze(-1))  # [s, t, V]
            mean_logit[tile] = (probs * x).sum(-1)  # [s, t, V] -> [s, t]
        ctx.save_for_backward(logits, logsumexp, mean_logit)
        ctx.temperature, ctx.positions = temperature, positions
        return (logsumexp - mean_logit).view(logits.shape[:-1])  # [P, T] -> [..., T]

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_output):
        logits, logsumexp, mean_logit = ctx.saved_tensors
        tiled = _as_3d(logits)  # [P, T, V]
        upstream = grad_output.reshape(tiled.shape[:-1]).unsqueeze(-1).to(logsumexp.dtype)  # [..., T] -> [P, T, 1]
        grad_logits = torch.empty(logits.shape, dtype=logits.dtype, device=logits.device)  # [..., T, V]
        grad_tiled = _as_3d(grad_logits)  # [P, T, V], a view: grad_logits is contiguous
        for tile in _tiles(tiled.shape[0], tiled.shape[1], ctx.positions):
            x = _scaled(tiled, tile, ctx.temperature)  # [s, t, V]
            probs = torch.exp(x - logsumexp[tile].unsqueeze(-1))  # [s, t, V]
            grad = -probs * (x - mean_logit[tile].unsqueeze(-1)) * upstream[tile]  # [s, t, V]
            grad_tiled[tile] = grad / ctx.temperature
        return grad_logits, None, None


def selective_logprobs(
    logits: torch.Tensor, token_ids: torch.Tensor, temperature: float = 1.0, chunk_size: int | None = None
) -> torch.Tensor:
    """log softmax(logits / temperature)[token_ids], [..., T, V] x [..., T] -> [..., T].

    Differentiable in ``logits``. ``chunk_size`` is the number of positions per tile (default:
    about 2**24 logits per tile); results do not depend on it.
    """
    if logits.dim() < 2 or token_ids.shape != logits.shape[:-1]:
        raise ValueError(f"token_ids shape {tuple(token_ids.shape)} does not match logits {tuple(logits.shape)}")
    positions = _positions_per_tile(logits.shape[-1], chunk_size)
    return _SelectiveLogprobs.apply(logits, token_ids.long(), float(temperature), positions)


def entropy_from_logits(logits: torch.Tensor, temperature: float = 1.0, chunk_size: int | None = None) -> torch.Tensor:
    """Entropy of softmax(logits / temperature) per position, [..., T, V] -> [..., T].

    H = -sum_j p_j log p_j = logsumexp(x) - sum_j p_j x_j. Differentiable in ``logits``; logits
    must be finite (a -inf logit gives 0 * -inf = NaN).
    """
    if logits.dim() < 2:
        raise ValueError(f"logits must be [..., T, V], got shape {tuple(logits.shape)}")
    positions = _positions_per_tile(logits.shape[-1], chunk_size)
    return _Entropy.apply(logits, float(temperature), positions)
