"""Whether an estimate fits: the memory free on a device, and one process's need beside its tensors."""

from __future__ import annotations

import torch

from grpokit.memory.estimate import MemoryEstimate

# What a CPU training process holds beyond its tensors (runtime, allocator): 0.5-0.8 GiB in bench/memory_estimate.py;
# the warning counts the low end, so it errs toward staying quiet.
PROCESS_OVERHEAD = 2**29


def available_bytes(device: torch.device) -> int | None:
    """Memory free for a new process on ``device``: the GPU's free memory, or the host's MemAvailable (Linux); else
    None."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    if device.type != "cpu":
        return None
    try:
        with open("/proc/meminfo") as f:
            fields = dict(line.split(":", 1) for line in f)
        return int(fields["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        return None


def process_bytes(estimate: MemoryEstimate, device: torch.device) -> int:
    """One training process's need: the tensors' peak, plus the process itself on CPU (:data:`PROCESS_OVERHEAD`)."""
    return estimate.peak + (PROCESS_OVERHEAD if device.type == "cpu" else 0)
