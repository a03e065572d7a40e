"""Where this process sits among the run's processes: one process here, torchrun ranks in distributed/.

The trainer and the rollout scheduler ask a context for every cross-process operation (shard a batch,
gather, sum, score rewards, sample in lockstep). :class:`SingleProcess` answers for one process:
rank 0 of 1, every collective the identity, so a single-process run never imports
:mod:`grpokit.distributed`. ``grpokit.distributed.torch_dist.DistContext`` extends it with
torch.distributed collectives for torchrun (``compose.arguments.run_processes`` picks one). This module
imports nothing from grpokit: it sits below every package that asks it.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import Any

import torch


def under_torchrun() -> bool:
    """True when torchrun started this process as one of several (``WORLD_SIZE`` > 1)."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def is_sharded(model: torch.nn.Module) -> bool:
    """Whether FSDP sharded ``model`` (``distributed.strategy: fsdp``)."""
    import sys

    fsdp = sys.modules.get("torch.distributed.fsdp")  # not imported: nothing can be sharded (and no import here)
    return fsdp is not None and isinstance(model, fsdp.FSDPModule)


@dataclass(frozen=True)
class RewardBatch:
    """This rank's rows to score: ``prompts``, ``completions``, the dataset's other ``columns``, ``group_size``
    (completions per prompt), ``completion_ids`` and the reward functions' ``trainer_state``."""

    prompts: list
    completions: list
    columns: dict
    group_size: int
    completion_ids: list | None = None
    trainer_state: Any = None


@dataclass
class SingleProcess:
    """One process: rank 0 of 1. Subclasses with more ranks override the collectives."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    def shard(self, items: list) -> tuple[list, int]:
        """This rank's contiguous share of ``items`` (length divisible by world_size) and its start offset."""
        size = len(items) // self.world_size
        start = self.rank * size
        return items[start : start + size], start

    def gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """Every rank's ``tensor`` [n, ...] concatenated in rank order: [world_size * n, ...]."""
        return tensor

    def gather_objects(self, obj) -> list:
        """One picklable object from every rank, in rank order."""
        return [obj]

    def scatter_objects(self, parts: list | None):
        """Rank 0 passes one picklable object per rank (others pass None); each rank gets its own."""
        return parts[0]

    def broadcast_object(self, obj):
        """Rank 0's picklable ``obj`` on every rank (the others pass anything, None)."""
        return obj

    def sum(self, value: torch.Tensor) -> torch.Tensor:
        """Sum of ``value`` over ranks."""
        return value

    def mean_metrics(self, metrics: dict[str, float]) -> dict[str, float]:
        """Each metric averaged over ranks (every rank passes the same keys)."""
        return metrics

    def barrier(self) -> None:
        """Wait for every rank."""

    def gather_rewards(self, result):
        """One RewardResult of every rank's completions, in rank order (the rows of the global batch)."""
        return result

    def score_rewards(self, runner, batch: RewardBatch, on_main: bool = False):
        """(this rank's RewardResult, the global batch's: every rank's rows in rank order) of ``batch``. The global
        result goes through ``runner.check_signal``. ``on_main``: score every rank's rows on rank 0
        (see ``DistContext.score_rewards``); one process is rank 0 already."""
        reward = runner.combine(
            runner.score_values(
                batch.prompts,
                batch.completions,
                batch.columns,
                batch.group_size,
                batch.completion_ids,
                batch.trainer_state,
            )
        )
        everyone = self.gather_rewards(reward)
        runner.check_signal(everyone)
        return reward, everyone

    def wrap(
        self, model: torch.nn.Module, device: torch.device, strategy: str = "ddp", compute_dtype=None
    ) -> torch.nn.Module:
        """The module the learner trains: ``model`` itself in one process (DDP or FSDP with several)."""
        return model

    def lockstep(self, model: torch.nn.Module):
        """A block in which every rank calls ``model``'s forward the same number of times, whatever each samples
        (FSDP's per-unit all-gathers need it): nothing to do here."""
        return contextlib.nullcontext()
