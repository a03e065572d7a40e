"""``trainer.accelerator``: the few ``accelerate.Accelerator`` members TRL code reads, over grpokit's process context.

TRL's GRPOTrainer is an ``accelerate`` trainer, and code written for it (its own helpers, such as
``get_high_entropy_mask``, callbacks, reward functions) asks ``trainer.accelerator`` where it runs and for its
collectives. grpokit's processes are a ``processes.SingleProcess`` (or torchrun's ``DistContext``);
:class:`ProcessAccelerator` answers those questions from it. ``gather_ragged`` gathers 1-D tensors whose length
differs between processes (the learner's masked entropies).
"""

from __future__ import annotations

import torch


def gather_ragged(procs, values: torch.Tensor) -> torch.Tensor:
    """Every process's 1-D ``values`` concatenated in rank order, whatever their lengths (one process: ``values``)."""
    if not procs.enabled:
        return values
    sizes = procs.gather(torch.tensor([values.numel()], device=values.device))  # [P]
    longest = int(sizes.max())
    padded = torch.zeros(longest, dtype=values.dtype, device=values.device)
    padded[: values.numel()] = values
    everyone = procs.gather(padded).view(procs.world_size, longest)  # [P, longest]
    return torch.cat([row[: int(n)] for row, n in zip(everyone, sizes)])


class ProcessAccelerator:
    """What ``accelerate.Accelerator`` answers, for grpokit's processes ``procs`` (a ``processes.SingleProcess``)."""

    def __init__(self, procs, device: torch.device):
        self.procs = procs
        self.device = device

    @property
    def num_processes(self) -> int:
        return self.procs.world_size

    @property
    def process_index(self) -> int:
        return self.procs.rank

    @property
    def local_process_index(self) -> int:
        return self.procs.local_rank

    @property
    def is_main_process(self) -> bool:
        return self.procs.is_main

    def gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """Every process's ``tensor`` (same shape on each) concatenated along dim 0; a 0-d tensor counts as [1]."""
        return self.procs.gather(tensor.reshape(1) if tensor.dim() == 0 else tensor)

    def pad_across_processes(self, tensor: torch.Tensor, dim: int = 0, pad_index: float = 0, pad_first: bool = False):
        """``tensor`` padded with ``pad_index`` along ``dim`` to the longest of every process's (before a gather)."""
        size = torch.tensor([tensor.shape[dim]], device=tensor.device)
        longest = int(self.procs.gather(size).max())
        missing = longest - tensor.shape[dim]
        if missing == 0:
            return tensor
        shape = list(tensor.shape)
        shape[dim] = missing
        pad = torch.full(shape, pad_index, dtype=tensor.dtype, device=tensor.device)
        return torch.cat([pad, tensor] if pad_first else [tensor, pad], dim=dim)

    def reduce(self, tensor: torch.Tensor, reduction: str = "sum") -> torch.Tensor:
        """``tensor`` summed (or averaged: ``reduction="mean"``) over processes."""
        total = self.procs.sum(tensor)
        return total / self.procs.world_size if reduction == "mean" else total

    def wait_for_everyone(self) -> None:
        self.procs.barrier()
