"""The SiLU-gated MLP of Llama-family models keeping only its inputs for the backward, for float32 training passes.

Through the Hugging Face module, ``down(silu(gate(x)) * up(x))`` keeps five tensors for the backward: x,
gate, silu(gate), up and the product; the last four are as wide as the MLP (4,864 at Qwen2.5-0.5B,
against 896 for x), so at one micro-batch of 32 completions of 0.5B they are ~2 GB of the ~5.5 GB of
saved activations. :class:`LeanMLP` keeps x, gate and up, and recomputes silu(gate) and the product
in the backward (two elementwise ops over tensors the backward reads anyway). Every op, forward and
backward, is the one autograd runs through the module (``mm`` with the same operands, ``silu_backward``,
the products), so the gradients are bitwise the module's.

Under CPU autocast (bf16) the module keeps more: x cast once for each of gate and up, gate, silu(gate), up and the
product, all in bf16, and autocast's cache keeps each weight's bf16 cast for the whole update (the learner runs one
autocast region per optimizer step). :class:`LeanCastMLP` casts x once and keeps it, gate and up: 2 h + 4 i bytes
less per token and layer than the module. The weights' casts stay autocast's (cast once per optimizer step; the
backward takes them from its cache again). Casting the weights in each pass instead of keeping them would spare
their 3 h i x 2 bytes per layer, but at a third of a matmul's time per cast on a 512-token pass here (39M's
micro-batch): not done. The ops are the module's under autocast, so the log-probs are the same and the gradients
equal within bf16 rounding (tests/unit/test_lean_mlp.py).

Where: :func:`lean_mlps` switches the MLPs of a Llama, Qwen2, Qwen3 or Mistral model for a block, for
calls that autograd records in float32, and under CPU autocast on a float32 x. Modules with biases, LoRA or
quantised layers, other activations, sharded weights or activation checkpointing keep the module's forward.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable
from torch.nn.parallel import DistributedDataParallel

from grpokit.models.loading import activation_checkpointing

MODEL_TYPES = ("llama", "qwen2", "qwen3", "mistral")  # transformers' model_type of the MLP classes below
MLP_CLASSES = ("LlamaMLP", "Qwen2MLP", "Qwen3MLP", "MistralMLP")


class LeanMLP(torch.autograd.Function):
    """down(silu(x W_gate^T) * (x W_up^T)) W_down^T for x [..., h], saving x, gate and up [..., i]."""

    @staticmethod
    def forward(ctx, x, w_gate, w_up, w_down):
        gate, up = F.linear(x, w_gate), F.linear(x, w_up)
        ctx.save_for_backward(x, gate, up, w_gate, w_up, w_down)
        return F.linear(F.silu(gate) * up, w_down)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        x, gate, up, w_gate, w_up, w_down = ctx.saved_tensors
        need_x, need_gate, need_up, need_down = ctx.needs_input_grad
        act = F.silu(gate)  # recomputed: the module keeps it
        grad = grad.reshape(-1, grad.size(-1))  # [m, h]; F.linear is a matmul over the flattened rows
        grad_h = grad.mm(w_down).view(gate.shape)  # [..., i]
        # as autograd: mul's backward gives each factor grad x the other, silu's is silu_backward
        grad_gate = torch.ops.aten.silu_backward(grad_h * up, gate).reshape(-1, gate.size(-1))  # [m, i]
        grad_up = (grad_h * act).reshape(-1, up.size(-1))  # [m, i]
        flat_x = x.reshape(-1, x.size(-1))  # [m, h]
        # a Linear's weight gradient is grad^T x (mm's backward for the transposed weight)
        g_down = grad.t().mm((act * up).reshape(-1, up.size(-1))) if need_down else None
        g_gate = grad_gate.t().mm(flat_x) if need_gate else None
        g_up = grad_up.t().mm(flat_x) if need_up else None
        g_x = (grad_gate.mm(w_gate) + grad_up.mm(w_up)).view(x.shape) if need_x else None
        return g_x, g_gate, g_up, g_down


class LeanCastMLP(torch.autograd.Function):
    """:class:`LeanMLP` as autocast to ``dtype`` runs the module (x and the weights cast to ``dtype``, the MLP's ops in
    it), saving x's cast once, gate and up. The weights' casts are autocast's own (its cache keeps the cast of a
    trainable weight until the outermost autocast region ends: the learner's backward runs inside it), taken again
    in the backward instead of saved."""

    @staticmethod
    def forward(ctx, x, w_gate, w_up, w_down, dtype):
        with torch.autocast(x.device.type, dtype=dtype):
            xc = x.to(dtype)  # autocast casts x once for gate's call and once for up's: the same values
            gate, up = F.linear(xc, w_gate), F.linear(xc, w_up)
            out = F.linear(F.silu(gate) * up, w_down)
        ctx.save_for_backward(xc, gate, up, w_gate, w_up, w_down)
        ctx.x_dtype = x.dtype
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        xc, gate, up, w_gate, w_up, w_down = ctx.saved_tensors
        need_x, need_gate, need_up, need_down, _ = ctx.needs_input_grad
        d = xc.dtype
        with torch.autocast(xc.device.type, dtype=d):  # the products with a weight take its (cached) cast
            act = F.silu(gate)  # recomputed, as the product below
            grad = grad.to(d).reshape(-1, grad.size(-1))  # [m, h]
            grad_h = grad.mm(w_down).view(gate.shape)  # [..., i]
            grad_gate = torch.ops.aten.silu_backward(grad_h * up, gate).reshape(-1, gate.size(-1))  # [m, i]
            grad_up = (grad_h * act).reshape(-1, up.size(-1))  # [m, i]
            flat_x = xc.reshape(-1, xc.size(-1))  # [m, h]
            # each gradient in the compute dtype, then in its input's dtype, as autocast's casts' backward gives it
            g_down = grad.t().mm((act * up).reshape(-1, up.size(-1))).to(w_down.dtype) if need_down else None
            g_gate = grad_gate.t().mm(flat_x).to(w_gate.dtype) if need_gate else None
            g_up = grad_up.t().mm(flat_x).to(w_up.dtype) if need_up else None
            g_x = None
            if need_x:  # x's two paths (gate's and up's casts) summed in x's dtype
                g_x = (grad_up.mm(w_up).to(ctx.x_dtype) + grad_gate.mm(w_gate).to(ctx.x_dtype)).view(xc.shape)
        return g_x, g_gate, g_up, g_down, None


def _lean_forward(mlp: torch.nn.Module):
    """``mlp``'s forward through :class:`LeanMLP` where autograd records a float32 call, through
    :class:`LeanCastMLP` where it records one on a float32 x under CPU autocast, else its own."""
    own = type(mlp).forward.__get__(mlp)

    def forward(x: torch.Tensor) -> torch.Tensor:
        weights = (mlp.gate_proj.weight, mlp.up_proj.weight, mlp.down_proj.weight)
        recorded = torch.is_grad_enabled() and (x.requires_grad or any(w.requires_grad for w in weights))
        if not recorded or x.dtype != torch.float32:
            return own(x)
        if torch.is_autocast_enabled(x.device.type):
            if x.device.type != "cpu":  # measured on CPU only: elsewhere autocast's cached casts stay
                return own(x)
            if any("forward" in vars(linear) for linear in (mlp.gate_proj, mlp.up_proj, mlp.down_proj)):
                return own(x)  # cast-once Linears (kernels/cast_linears.py) hold the step's casts: use them
            return LeanCastMLP.apply(x, *weights, torch.get_autocast_dtype(x.device.type))
        return LeanMLP.apply(x, *weights)

    return forward


def _leanable(mlp: torch.nn.Module) -> bool:
    """A Llama-family MLP of plain bias-free float32 Linears with SiLU, its class's own forward."""
    if type(mlp).__name__ not in MLP_CLASSES or "forward" in vars(mlp):
        return False
    act = getattr(mlp, "act_fn", None)
    if type(act).__name__ not in ("SiLUActivation", "SiLU") or "forward" in vars(act):
        return False
    linears = [getattr(mlp, name, None) for name in ("gate_proj", "up_proj", "down_proj")]
    return all(
        type(linear) is torch.nn.Linear
        and linear.bias is None
        and type(linear.weight.data) is torch.Tensor  # not a DTensor shard
        and linear.weight.dtype == torch.float32
        for linear in linears
    )


def base_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The modules of ``model``'s base model (through DDP and peft), or none under activation checkpointing: its
    recompute runs after a block and must save what the first forward saved."""
    model = model.module if isinstance(model, DistributedDataParallel) else model
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return [] if activation_checkpointing(base) else list(base.modules())


@contextlib.contextmanager
def own_forwards_swapped(modules: list[torch.nn.Module], make_forward):
    """Each module's forward is ``make_forward(module)`` while inside (an instance attribute shadowing its class's);
    yields how many."""
    try:
        for module in modules:
            module.forward = make_forward(module)
        yield len(modules)
    finally:
        for module in modules:
            vars(module).pop("forward", None)


@contextlib.contextmanager
def lean_mlps(model: torch.nn.Module):
    """Run the supported MLPs of ``model`` (an HF model, a peft wrapper of one, either inside DDP) through
    :class:`LeanMLP` while inside; yields how many. Autograd keeps what each call saved, so a backward after
    the block needs nothing from it. Not with activation checkpointing (:func:`base_modules`)."""
    mlps = [m for m in base_modules(model) if _leanable(m)]
    with own_forwards_swapped(mlps, _lean_forward) as count:
        yield count
