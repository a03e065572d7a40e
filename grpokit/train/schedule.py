"""Learning-rate schedules: linear warmup, then constant, linear decay to 0, or cosine decay to 0."""

from __future__ import annotations

import math

import torch


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
