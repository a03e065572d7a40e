"""The optimizer (AdamW, made from its settings, :mod:`optimizer_settings`) and its state, and learning-rate
schedules: linear warmup, then constant, linear decay to 0, or cosine decay to 0."""

from __future__ import annotations

import math

import torch

from grpokit.train.learning.optimizer_settings import OptimizerSettings


def make_optimizer(
    params: list, settings: OptimizerSettings, device: torch.device, learning_rate: float | None = None
) -> torch.optim.Optimizer:
    """The optimizer ``settings.optimizer`` names over ``params``, with ``settings.hyper(learning_rate)``: torch's
    AdamW, fused (:func:`fused_adamw`), or bitsandbytes' AdamW8bit (:mod:`grpokit.train.learning.adamw8bit`). The
    policy's and PPO's critic's (``learning_rate``: the critic's own)."""
    hyper = settings.hyper(learning_rate)
    if not settings.eight_bit:
        return fused_adamw(params, device, **hyper)
    try:
        from grpokit.train.learning.adamw8bit import AdamW8bit
    except ImportError:
        raise ImportError(
            f"optimizer: {settings.optimizer} needs bitsandbytes: pip install 'grpokit[qlora]'."
        ) from None
    return AdamW8bit(params, **hyper)


def make_schedule(optimizer: torch.optim.Optimizer, settings: OptimizerSettings, total_steps: int):
    """The learning-rate schedule ``settings`` names over ``total_steps`` optimizer steps (:func:`make_scheduler`)."""
    return make_scheduler(optimizer, settings.lr_scheduler_type, settings.warmup(total_steps), total_steps)


def lr_lambda(kind: str, warmup_steps: int, total_steps: int):
    """Multiplier of the peak LR at optimizer step s (0-based), as in transformers' schedules."""

    def factor(step: int) -> float:
        if step < warmup_steps:
            return step / warmup_steps
        if kind == "constant":
            return 1.0
        progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
        if kind == "linear":
            return max(0.0, 1.0 - progress)
        if kind == "cosine":
            return 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0)))
        raise ValueError(f"unknown lr_scheduler_type {kind!r}; choose constant, linear or cosine.")

    return factor


def make_scheduler(optimizer: torch.optim.Optimizer, kind: str, warmup_steps: int, total_steps: int):
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(kind, warmup_steps, total_steps))


def fused_adamw(params: list, device: torch.device, **hyper) -> torch.optim.AdamW:
    """torch's AdamW over ``params`` with ``hyper`` (lr, betas, eps, weight_decay), fused on CPU and CUDA (one kernel
    per parameter, no foreach temporaries; on CPU ~4x faster than the default), its state made now
    (:func:`allocate_state`): the policy's and PPO's critic's optimizer."""
    return allocate_state(torch.optim.AdamW(params, **hyper, fused=device.type in ("cpu", "cuda")))


def allocate_state(optimizer: torch.optim.AdamW) -> torch.optim.AdamW:
    """``optimizer`` with its state made now as its first step would make it (step 0, zero moments), not lazily.

    Made lazily, the moments (twice the trainable weights) are allocated at the end of the first update, into
    whatever the activations and gradients left free; glibc's heap, which the CLI never trims, then keeps the holes
    around them for the whole run. Made here, before any step, they sit beside the weights. Same numbers: torch's
    own initialisation (``AdamW._init_group``) does exactly this for a parameter whose state is empty."""
    for group in optimizer.param_groups:
        for p in group["params"]:
            state = optimizer.state[p]
            if state:
                continue
            on_device = group["fused"] or group["capturable"]
            # torch's scalar dtype for the step: float32 when fused, else float64 only under a float64 default dtype
            default = torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32
            step_dtype = torch.float32 if group["fused"] else default
            state["step"] = torch.zeros((), dtype=step_dtype, device=p.device if on_device else "cpu")
            moments = ["exp_avg", "exp_avg_sq"] + (["max_exp_avg_sq"] if group["amsgrad"] else [])
            for name in moments:
                state[name] = torch.zeros_like(p, memory_format=torch.preserve_format)
    return optimizer
