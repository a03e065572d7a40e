"""Learning-rate schedules: linear warmup, then constant, linear decay to 0, or cosine decay to 0."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class OptimSpec:
    """An AdamW and its schedule: peak ``learning_rate``, ``betas``, ``eps``, ``weight_decay``, ``optimizer``
    (adamw_torch_fused | an 8-bit name), and ``lr_scheduler_type`` with ``warmup_steps`` over ``total_steps``
    optimizer steps. Built once by the composition root (:func:`grpokit.train.specs.optim_spec`)."""

    learning_rate: float
    betas: tuple[float, float]
    eps: float
    weight_decay: float
    optimizer: str
    lr_scheduler_type: str
    warmup_steps: int
    total_steps: int

    def scheduler(self, optimizer: torch.optim.Optimizer):
        """The LR schedule of ``optimizer`` (:func:`make_scheduler`)."""
        return make_scheduler(optimizer, self.lr_scheduler_type, self.warmup_steps, self.total_steps)


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
