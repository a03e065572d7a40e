"""The LM head's logits at a few chosen ids per position, with their gradient, without the [m, V] logits.

For m positions with hidden states h [m, H], LM head W [V, H] (bias b) and ids [m, c] (c ids each):

    z[i, j] = h_i . W[ids[i, j]] + b[ids[i, j]],
    dL/dh_i = sum_j g[i, j] W[ids[i, j]],   dL/dW[v] = sum_{(i, j): ids[i, j] = v} g[i, j] h_i.

The gathered rows W[ids] ([m, c, H]) are never kept: the forward and the backward gather them chunk by chunk of rows
(about ``CHUNK_ELEMENTS`` gathered weights at a time), so memory is that of h and ids. Plain autograd through
``W[ids]`` would keep [m, c, H] for its backward (20 ids x 8,192 positions x a 2,048 hidden size: 1.3 GB float32).
Computed in float32. A trainable leaf weight gets its gradient added straight into ``weight.grad``, as the fused head
does (:mod:`grpokit.kernels.fused_head`), so the two add up in the same dense tensor.

With the fused head's log p(y) (its own logsumexp inside), the log-probs at other ids need no logsumexp of their own:
log p(v) = z_v - lse = z_v - z_y + log p(y) (:func:`grpokit.train.learning.policy_logprobs.completion_topk`).
"""

from __future__ import annotations

import torch

CHUNK_ELEMENTS = 2**22  # gathered weight elements per chunk (16 MiB float32)


def _rows_per_chunk(c: int, H: int) -> int:
    return max(1, CHUNK_ELEMENTS // max(c * H, 1))


class _GatheredLogits(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, bias, ids):
        m, c = ids.shape
        h = hidden.float()
        out = torch.empty((m, c), dtype=torch.float32, device=hidden.device)
        step = _rows_per_chunk(c, h.size(1))
        with torch.autocast(hidden.device.type, enabled=False):
            for s in range(0, m, step):
                rows = weight[ids[s : s + step]].float()  # [r, c, H]
                out[s : s + step] = torch.bmm(rows, h[s : s + step, :, None]).squeeze(-1)  # [r, c]
        if bias is not None:
            out += bias.float()[ids]
        ctx.save_for_backward(hidden, weight, ids)
        ctx.has_bias = bias is not None
        ctx.accumulate_into = weight if weight.is_leaf and weight.requires_grad else None
        return out

    @staticmethod
    def backward(ctx, grad):
        hidden, weight, ids = ctx.saved_tensors
        m, c = ids.shape
        H = hidden.size(1)
        grad = grad.float()
        grad_hidden = torch.empty((m, H), dtype=torch.float32, device=hidden.device)
        grad_weight = None
        if ctx.accumulate_into is not None:
            if ctx.accumulate_into.grad is None:
                ctx.accumulate_into.grad = torch.zeros_like(weight)
            grad_weight = ctx.accumulate_into.grad
        elif ctx.needs_input_grad[1]:
            grad_weight = torch.zeros_like(weight)
        step = _rows_per_chunk(c, H)
        with torch.autocast(hidden.device.type, enabled=False):
            for s in range(0, m, step):
                g = grad[s : s + step]  # [r, c]
                rows = weight[ids[s : s + step]].float()  # [r, c, H]
                grad_hidden[s : s + step] = torch.bmm(g[:, None], rows).squeeze(1)  # [r, H]
                if grad_weight is not None:
                    h = hidden[s : s + step].float()  # [r, H]
                    contrib = g[:, :, None] * h[:, None, :]  # [r, c, H]
                    grad_weight.index_add_(0, ids[s : s + step].reshape(-1), contrib.reshape(-1, H).to(weight.dtype))
        grad_bias = None
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_bias = torch.zeros(weight.size(0), dtype=torch.float32, device=hidden.device)
            grad_bias.index_add_(0, ids.reshape(-1), grad.reshape(-1))
        if ctx.accumulate_into is not None:
            grad_weight = None  # already in .grad
        return grad_hidden.to(hidden.dtype), grad_weight, grad_bias, None


def gathered_logits(
    hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, ids: torch.Tensor
) -> torch.Tensor:
    """[m, c] float32 logits of hidden [m, H] at ids [m, c] under the head (weight [V, H], bias [V] or None),
    differentiable in ``hidden``, ``weight`` and ``bias`` (module docstring)."""
    if hidden.dim() != 2 or ids.dim() != 2 or ids.size(0) != hidden.size(0):
        raise ValueError(f"hidden must be [m, H] and ids [m, c]; got {tuple(hidden.shape)} and {tuple(ids.shape)}")
    return _GatheredLogits.apply(hidden, weight, bias, ids.long())
