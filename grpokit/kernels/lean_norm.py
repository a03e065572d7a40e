"""The RMSNorm of Llama-family models keeping only its input for the backward, for training passes over a float32
residual stream (float32, or under autocast, which leaves the norm's elementwise ops in float32).

Through the Hugging Face module, ``weight * (x * rsqrt(mean(x^2) + eps))`` keeps x and the normalised
``x * rsqrt(...)`` for the backward, both as wide as the hidden state: per decoder layer two norms, so 2 x h
floats per token (Qwen3's per-head q/k norms add as much again for the queries and keys). :class:`LeanRMSNorm`
keeps x and the rsqrt ([..., 1]) and recomputes the normalised x in the backward, one elementwise product.
Every op, forward and backward, is the one autograd runs through the module (the products, rsqrt's
``-0.5 * grad * result^3``, mean's ``expand / n``, pow's ``grad * 2x``, the broadcasts' sums), so the
gradients are bitwise the module's.

Where: :func:`lean_norms` switches the RMSNorms of a Llama, Qwen2, Qwen3 or Mistral model for a block, for
calls that autograd records on a float32 x, with or without autocast (in another dtype the module runs). Modules of
other classes, with a forward of their own, or under activation checkpointing keep the module's forward.
"""

from __future__ import annotations

import contextlib

import torch
from torch.autograd.function import once_differentiable

from grpokit.kernels.lean_mlp import base_modules, own_forwards_swapped

NORM_CLASSES = ("LlamaRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm", "MistralRMSNorm")


class LeanRMSNorm(torch.autograd.Function):
    """weight * (x * rsqrt(mean(x^2, -1) + eps)) for x [..., n], saving x and the rsqrt [..., 1].

    Called as ``apply(x, x, weight, eps)``: x's gradient has two paths through the norm (the product with the rsqrt,
    and pow), which autograd adds to x's other gradients one at a time, the product's first (the later op). As two
    inputs, the two paths reach x's gradient as separate terms in that order, so their sum with the residual
    stream's gradient is rounded as through the module."""

    @staticmethod
    def forward(ctx, x, x_again, weight, eps):
        r = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)  # [..., 1]
        ctx.save_for_backward(x, r, weight)
        return weight * (x * r)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        x, r, weight = ctx.saved_tensors
        need_x, _, need_weight, _ = ctx.needs_input_grad
        g_weight = (grad * (x * r)).sum_to_size(weight.shape) if need_weight else None  # x * r recomputed
        if not need_x:
            return None, None, g_weight, None
        g_normed = grad * weight
        g_r = (g_normed * x).sum_to_size(r.shape)  # the product's gradient for its broadcast factor
        g_variance = -0.5 * g_r * r.pow(3)  # rsqrt's backward, from its result
        g_square = g_variance.expand_as(x) / x.size(-1)  # mean's
        return g_normed * r, g_square * (2.0 * x), g_weight, None  # the product's path, pow's


def _lean_forward(norm: torch.nn.Module):
    """``norm``'s forward through :class:`LeanRMSNorm` where autograd records a float32 call, else its own."""
    own = type(norm).forward.__get__(norm)

    def forward(x: torch.Tensor) -> torch.Tensor:
        recorded = torch.is_grad_enabled() and (x.requires_grad or norm.weight.requires_grad)
        # under autocast too: the module's ops on a float32 x are float32 ones (autocast casts matmuls' inputs only)
        if not recorded or x.dtype != torch.float32:
            return own(x)
        return LeanRMSNorm.apply(x, x, norm.weight, norm.variance_epsilon)

    return forward


def _leanable(norm: torch.nn.Module) -> bool:
    """An RMSNorm of the classes above with a plain float32 weight, its class's own forward."""
    weight = getattr(norm, "weight", None)
    return (
        type(norm).__name__ in NORM_CLASSES
        and "forward" not in vars(norm)
        and isinstance(getattr(norm, "variance_epsilon", None), float)
        and type(weight) is torch.nn.Parameter
        and type(weight.data) is torch.Tensor  # not a DTensor shard
        and weight.dtype == torch.float32
    )


@contextlib.contextmanager
def lean_norms(model: torch.nn.Module):
    """Run the supported RMSNorms of ``model`` (an HF model, a peft wrapper of one, either inside DDP) through
    :class:`LeanRMSNorm` while inside; yields how many. As :func:`grpokit.kernels.lean_mlp.lean_mlps`: autograd
    keeps what each call saved, and nothing changes under activation checkpointing."""
    norms = [m for m in base_modules(model) if _leanable(m)]
    with own_forwards_swapped(norms, _lean_forward) as count:
        yield count
