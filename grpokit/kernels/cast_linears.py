"""The policy's Linear layers computing from one cast of their float32 weights per optimizer step, under autocast.

Under CPU autocast a Linear with float32 weights casts its weight (and bias) to the autocast dtype at every call
and multiplies with that fresh copy; autocast keeps its casts of trainable weights only until its outermost
region ends. :func:`cast_linears` instead gives each Linear of a trainable model one cast per weight version,
held by :class:`LinearCasts` for as long as the learner's region is open (one ``Learner.update``): the
old-policy pass and every micro-batch of every optimizer step read the same copy, and a weight changed in
place (the optimizer's step, ``load_state_dict``, any ``copy_``) bumps its tensor version, so its next call
casts again: a stale copy is never served. The learner also clears the copies after each optimizer step
(:meth:`LinearCasts.clear`), so no stale copy is held until the next forward.

With autograd, :class:`CastLinear` computes y = x_c W_c^T + b_c from the cast copies (x_c: x in the autocast
dtype, as autocast casts it) and its backward is the one autograd runs through autocast's ops: grad_x = g W_c
and grad_W = g^T x_c in the autocast dtype (oneDNN accumulates in float32), each then cast back to its input's
dtype, as the backward of autocast's casts does; the gradients reach the float32 master weights. With
``pack``, no-grad calls (the old-policy pass) multiply with a oneDNN-packed copy
(:func:`grpokit.kernels.packed_linear.pack`, bitwise ``F.linear`` in bf16), kept beside the plain copy.

Which layers: exact ``nn.Linear`` modules with float32 CPU weights that are not sharded (LoRA's base and
adapter layers are such Linears); none under activation checkpointing (its recompute must save what the first
forward saved, :func:`grpokit.kernels.lean_mlp.base_modules`). Off by default (``Kernels.cast_once_linears``): not
measured faster on a CPU without AMX (docs/performance.md). Only inside an autocast region of the cast dtype;
anywhere else each layer runs its own forward. A no-op without autocast (float32 learning): the numbers are then
the module's own.
"""

from __future__ import annotations

import contextlib
import weakref

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from grpokit.kernels.lean_mlp import base_modules, own_forwards_swapped
from grpokit.kernels.packed_linear import pack as pack_weight


class LinearCasts:
    """One run's casts of Linear weights (and biases) to the autocast dtype, held while a :meth:`reuse` block is
    open; ``made`` counts the casts made (tests count them)."""

    def __init__(self):
        self._casts: dict[int, tuple] | None = None  # id(weight) -> (weakref, key, cast, packed or None)
        self.made = 0

    @contextlib.contextmanager
    def reuse(self):
        """Keep each cast for reuse inside this block (nested blocks share the outermost one's); dropped at its end."""
        outer = self._casts
        if outer is None:
            self._casts = {}
        try:
            yield
        finally:
            self._casts = outer

    def clear(self) -> None:
        """Drop every cast (after an optimizer step: the weights they were made from have changed)."""
        if self._casts is not None:
            self._casts.clear()

    def __len__(self) -> int:
        return 0 if self._casts is None else len(self._casts)

    def cast(self, weight: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """``weight`` in ``dtype``: the kept cast while the weight is unchanged (same tensor, version and storage)."""
        return self._entry(weight, dtype)[2]

    def packed(self, weight: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype, rows: int):
        """A :class:`grpokit.kernels.packed_linear.PackedLinear` of ``weight`` and ``bias`` in ``dtype``, kept
        like :meth:`cast`; None where oneDNN does not pack ``dtype`` here or no block is open."""
        if self._casts is None:
            return None
        entry = self._entry(weight, dtype)
        if entry[3] is None:
            low_bias = None if bias is None else self.cast(bias, dtype)
            packed = pack_weight(entry[2], low_bias, dtype, rows)
            entry = (*entry[:3], packed if packed is not None else False)
            self._casts[id(weight)] = entry
        return entry[3] or None

    def _entry(self, weight: torch.Tensor, dtype: torch.dtype) -> tuple:
        """(weakref to weight, its key, its cast, its packed copy: None not made, False refused)."""
        key = (weight._version, weight.data_ptr(), dtype)
        if self._casts is None:
            return (None, key, weight.detach().to(dtype), None)
        entry = self._casts.get(id(weight))
        if entry is None or entry[0]() is not weight or entry[1] != key:
            entry = (weakref.ref(weight), key, weight.detach().to(dtype), None)
            self._casts[id(weight)] = entry
            self.made += 1
        return entry


class CastLinear(torch.autograd.Function):
    """x W^T + b from ``w_low`` and ``b_low``, the casts of ``weight`` and ``bias``; gradients for x, weight, bias."""

    @staticmethod
    def forward(ctx, x, weight, bias, w_low, b_low):
        x_low = x.to(w_low.dtype)
        ctx.save_for_backward(x_low, w_low)
        ctx.dtypes = (x.dtype, weight.dtype, None if bias is None else bias.dtype)
        return F.linear(x_low, w_low, b_low)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        x_low, w_low = ctx.saved_tensors
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        x_dtype, w_dtype, b_dtype = ctx.dtypes
        flat = grad.to(w_low.dtype).reshape(-1, grad.size(-1))  # [m, out]: F.linear is a matmul of flattened rows
        g_x = flat.mm(w_low).view(x_low.shape).to(x_dtype) if need_x else None
        g_w = flat.t().mm(x_low.reshape(-1, x_low.size(-1))).to(w_dtype) if need_w else None
        g_b = flat.sum(0).to(b_dtype) if need_b else None
        return g_x, g_w, g_b, None, None


def _castable(linear: torch.nn.Module) -> bool:
    weight = linear.weight
    return (
        type(linear) is torch.nn.Linear
        and "forward" not in vars(linear)
        and type(weight.data) is torch.Tensor  # not a DTensor shard
        and weight.device.type == "cpu"
        and weight.dtype == torch.float32
        and (linear.bias is None or linear.bias.dtype == torch.float32)
    )


def _cast_forward(casts: LinearCasts, dtype: torch.dtype, pack: bool, rows: int):
    def make(linear: torch.nn.Linear):
        own = type(linear).forward.__get__(linear)

        def forward(x: torch.Tensor) -> torch.Tensor:
            if not torch.is_autocast_enabled("cpu") or torch.get_autocast_dtype("cpu") != dtype:
                return own(x)
            weight, bias = linear.weight, linear.bias
            params = (weight,) if bias is None else (weight, bias)
            recorded = torch.is_grad_enabled() and (x.requires_grad or any(p.requires_grad for p in params))
            if not recorded and pack:
                packed = casts.packed(weight, bias, dtype, rows)
                if packed is not None:
                    return packed(x)
            w_low = casts.cast(weight, dtype)
            b_low = None if bias is None else casts.cast(bias, dtype)
            if not recorded:
                return F.linear(x.to(dtype), w_low, b_low)
            return CastLinear.apply(x, weight, bias, w_low, b_low)

        return forward

    return make


@contextlib.contextmanager
def cast_linears(model: torch.nn.Module, casts: LinearCasts, dtype: torch.dtype, *, pack: bool = False, rows: int = 64):
    """Inside this block, ``model``'s float32 CPU Linears (:func:`_castable`) called under autocast of ``dtype``
    compute from ``casts``'s copies (kept until the outermost block ends); ``pack``: no-grad calls use packed
    copies made for about ``rows`` rows per call. Yields the number of layers switched."""
    linears = [m for m in base_modules(model) if isinstance(m, torch.nn.Linear) and _castable(m)]
    with casts.reuse(), own_forwards_swapped(linears, _cast_forward(casts, dtype, pack, rows)) as count:
        yield count
