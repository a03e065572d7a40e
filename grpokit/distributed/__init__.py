"""Scaling out: torch.distributed data parallelism (torchrun) and Ray rollout workers.

Ray is imported only by :mod:`grpokit.distributed.ray_rollout`, so ``import grpokit`` works without it.
"""

from grpokit.distributed.seeding import (
    concat_rollouts,
    generate_per_group,
    group_seed,
    split_rollouts,
)
from grpokit.distributed.torch_dist import (
    DistContext,
    exit_process,
    gather_reward_result,
    init_distributed,
    shutdown_distributed,
    wrap_data_parallel,
)

__all__ = [
    "DistContext",
    "concat_rollouts",
    "exit_process",
    "gather_reward_result",
    "generate_per_group",
    "group_seed",
    "init_distributed",
    "shutdown_distributed",
    "split_rollouts",
    "wrap_data_parallel",
]
