"""The memory a training step took, logged with its metrics (the report's Memory panel):

- ``memory/peak_rss_gib``: the process's peak resident set size so far (``getrusage``'s ``ru_maxrss``: KiB on Linux,
  bytes on macOS), in GiB; the CPU's memory, model, optimizer and activations included. It never falls: a step that
  needs more than any before raises it.
- ``memory/cuda_max_allocated_gib`` (a CUDA device): the most memory torch's allocator held for tensors during the
  step (``torch.cuda.max_memory_allocated``), then the peak is reset for the next step
  (``torch.cuda.reset_peak_memory_stats``); ``memory/cuda_max_reserved_gib`` the most it reserved from the driver.
"""

from __future__ import annotations

import sys

GIB = 2**30


def peak_rss_bytes() -> int | None:
    """The process's peak resident set size in bytes (None where ``resource`` is missing: Windows)."""
    try:
        import resource
    except ImportError:
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def step_memory(device) -> dict[str, float]:
    """This step's memory metrics (module docstring) for a process training on ``device`` (a ``torch.device``)."""
    metrics = {}
    rss = peak_rss_bytes()
    if rss is not None:
        metrics["memory/peak_rss_gib"] = rss / GIB
    if getattr(device, "type", None) == "cuda":
        import torch

        metrics["memory/cuda_max_allocated_gib"] = torch.cuda.max_memory_allocated(device) / GIB
        metrics["memory/cuda_max_reserved_gib"] = torch.cuda.max_memory_reserved(device) / GIB
        torch.cuda.reset_peak_memory_stats(device)
    return metrics
