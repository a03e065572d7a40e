"""Scaling out: torch.distributed data parallelism (torchrun) and Ray rollout workers.

Ray is imported only by :mod:`grpokit.distributed.ray_rollout`, so ``import grpokit`` works without it.
A single process never imports this package: :mod:`grpokit.system.processes` stands in for it.
"""

from grpokit.distributed.torch_dist import (
    DistContext,
    exit_process,
    init_distributed,
    shutdown_distributed,
)

__all__ = [
    "DistContext",
    "exit_process",
    "init_distributed",
    "shutdown_distributed",
]
