"""Data-parallel training with torch.distributed (``torchrun --nproc_per_node K -m grpokit train CONFIG``).

Every process draws the same global batch of prompts (same data seed) and takes its contiguous
share of groups, so a group never straddles two processes. Rewards are gathered across processes
before advantages are computed, so batch-level scaling (``scale_rewards=batch``) sees the whole
batch; each process then keeps the advantages of its own rows. Gradients are averaged by DDP.
Only rank 0 writes the rollout store, metrics, checkpoints and the final model.

gloo on CPU; on CUDA one GPU per process (``LOCAL_RANK``) and a group with two backends, NCCL for CUDA tensors
and gloo for the CPU tensors of the trainer's own collectives (:func:`process_group_backend`).
"""

from __future__ import annotations

import contextlib
import os
import sys
from dataclasses import dataclass

import torch
import torch.distributed as dist

from grpokit.system.processes import RewardBatch, SingleProcess, is_sharded


@dataclass
class DistContext(SingleProcess):
    """A torchrun rank: :class:`~grpokit.system.processes.SingleProcess`'s operations as torch.distributed
    collectives."""

    def gather(self, tensor: torch.Tensor) -> torch.Tensor:
        if not self.enabled:
            return tensor
        parts = [torch.empty_like(tensor) for _ in range(self.world_size)]
        dist.all_gather(parts, tensor.contiguous())
        return torch.cat(parts)

    def gather_objects(self, obj) -> list:
        if not self.enabled:
            return [obj]
        out = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def scatter_objects(self, parts: list | None):
        if not self.enabled:
            return parts[0]
        out = [None]
        dist.scatter_object_list(out, parts if self.is_main else None, src=0)
        return out[0]

    def broadcast_object(self, obj):
        if not self.enabled:
            return obj
        box = [obj if self.is_main else None]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def sum(self, value: torch.Tensor) -> torch.Tensor:
        """A copy: the sum of ``value`` over ranks."""
        if not self.enabled:
            return value
        value = value.clone()
        dist.all_reduce(value)
        return value

    def mean_metrics(self, metrics: dict[str, float]) -> dict[str, float]:
        """Averaged over ranks, so all ranks agree on the values that stop a run (kl, nonfinite). Per-rank
        means are averaged: with equal shares that is the global mean of per-sequence quantities such as
        the loss."""
        if not self.enabled:
            return metrics
        keys = sorted(metrics)
        values = torch.tensor([float(metrics[k]) for k in keys], dtype=torch.float64)
        dist.all_reduce(values)
        return dict(zip(keys, (values / self.world_size).tolist()))

    def barrier(self) -> None:
        if self.enabled:
            dist.barrier()

    def gather_rewards(self, result):
        if not self.enabled:
            return result
        from grpokit.rewards.runner import RewardResult

        parts = self.gather_objects(result)
        return RewardResult(
            names=parts[0].names,
            per_func=torch.cat([p.per_func for p in parts]),  # [N_global, F]
            combined=torch.cat([p.combined for p in parts]),  # [N_global]
            errors=[e for p in parts for e in p.errors],
            error_counts={name: sum(p.error_counts[name] for p in parts) for name in parts[0].names},
            logged={
                name: [v for p in parts for v in p.logged.get(name, [])]
                for name in sorted({k for p in parts for k in p.logged})
            },
            extra={
                column: [v for p in parts for v in p.extra.get(column, [None] * len(p.errors))]
                for column in sorted({k for p in parts for k in p.extra})
            },
            seconds={name: max(p.seconds.get(name, 0.0) for p in parts) for name in parts[0].seconds},  # at once
        )

    def score_rewards(self, runner, batch: RewardBatch, on_main: bool = False):
        """``on_main=False``: every rank scores its own rows and the results are gathered. ``on_main=True``
        (Ray reward workers, which only rank 0 is connected to): every rank sends its rows to rank 0
        (``gather_object``), rank 0 scores the global batch with its runner and broadcasts the checked
        values, and every rank keeps its rows (equal shares). An error on rank 0 (a wrong length, a
        lost Ray connection) is broadcast instead and raised on every rank as a RewardError with the
        same message, so the other ranks stop instead of waiting.
        """
        if not (self.enabled and on_main):
            return super().score_rewards(runner, batch)
        prompts, completions, columns, completion_ids = (
            batch.prompts,
            batch.completions,
            batch.columns,
            batch.completion_ids,
        )
        from grpokit.rewards.contract import RewardError

        parts = [None] * self.world_size if self.is_main else None
        dist.gather_object((prompts, completions, columns, completion_ids), parts, dst=0)
        payload, failure = None, None
        if self.is_main:
            try:
                payload = runner.score_values(
                    [p for part in parts for p in part[0]],
                    [c for part in parts for c in part[1]],
                    {key: [v for part in parts for v in part[2][key]] for key in columns},
                    batch.group_size,
                    None if completion_ids is None else [ids for part in parts for ids in part[3]],
                    batch.trainer_state,
                )
            except Exception as exc:
                failure = exc
                payload = (
                    str(exc)
                    if isinstance(exc, RewardError)
                    else f"rank 0 could not score the rewards: {type(exc).__name__}: {exc}"
                )
        box = [payload]
        dist.broadcast_object_list(box, src=0)
        if failure is not None:
            raise failure
        if isinstance(box[0], str):
            raise RewardError(box[0])
        n = len(completions)
        mine = box[0].rows(slice(self.rank * n, (self.rank + 1) * n))
        everyone = runner.combine(box[0])
        runner.check_signal(everyone)
        return runner.combine(mine), everyone

    def wrap(
        self, model: torch.nn.Module, device: torch.device, strategy: str = "ddp", compute_dtype=None
    ) -> torch.nn.Module:
        """DDP around ``model``, or ``model`` itself sharded in place with FSDP (:mod:`grpokit.distributed.fsdp`).

        With DDP, generation and the reference pass keep using the bare ``model``: they need no gradient
        sync. Every rank starts from rank 0's weights: DDP broadcasts them at construction; FSDP fills each
        rank's shard from rank 0's full state dict (the other ranks' copies may be on the meta device), its units
        gathering in ``compute_dtype`` (the autocast dtype; None: the weights') and reducing in float32.
        """
        if not self.enabled:
            return model
        if strategy == "fsdp":
            from grpokit.distributed.fsdp import shard_from_rank0
            from grpokit.machine.precision import fsdp_mixed_precision

            policy = fsdp_mixed_precision(compute_dtype)
            return shard_from_rank0(model, is_main=self.is_main, device=device, mp_policy=policy)
        from torch.nn.parallel import DistributedDataParallel

        ids = [device.index if device.index is not None else self.local_rank] if device.type == "cuda" else None
        return DistributedDataParallel(model, device_ids=ids)

    def lockstep(self, model: torch.nn.Module):
        """FSDP: ranks call the sharded ``model``'s forward in lockstep (:class:`grpokit.distributed.fsdp.Lockstep`);
        nothing to do for DDP's bare model or one process (no collective in its forward)."""
        if not (self.enabled and is_sharded(model)):
            return contextlib.nullcontext()
        from grpokit.distributed.fsdp import Lockstep

        return Lockstep(model)


def init_distributed() -> DistContext:
    """Join the process group that torchrun describes (RANK, WORLD_SIZE, LOCAL_RANK); a single
    process without those variables gets the trivial context."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size <= 1:
        return DistContext()
    rank, local_rank = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    if not dist.is_initialized():
        cuda = torch.cuda.is_available()
        device_id = None
        if cuda:
            torch.cuda.set_device(local_rank)  # "cuda" then means this process's GPU
            device_id = torch.device("cuda", local_rank)
        dist.init_process_group(backend=process_group_backend(cuda), device_id=device_id)
    return DistContext(rank=rank, world_size=world_size, local_rank=local_rank)


def process_group_backend(cuda: bool, gpu_backend: str = "nccl") -> str:
    """The process group's backends: on CUDA, NCCL for CUDA tensors (DDP's and FSDP's gradients and shards) and gloo
    for CPU tensors, which the trainer's own collectives gather (advantages, lengths, token counts, float64
    metrics, pickled objects); an NCCL-only group fails on those with "No backend type associated with device type
    cpu". ``gpu_backend``: tests put gloo there to run the same two-backend group on a CPU."""
    return f"cpu:gloo,cuda:{gpu_backend}" if cuda else "gloo"


def shutdown_distributed(finished: bool) -> bool:
    """Leave the process group, if one was joined (then True): after a ``finished`` run all ranks meet
    first, then the group is destroyed. Left to interpreter exit, gloo's teardown races the other rank
    closing its connections, which can abort (SIGABRT) a rank that finished fine. Without ``finished``
    (a rank stopped early) there is no barrier: the others may never reach it."""
    if not dist.is_initialized():
        return False
    if finished:
        dist.barrier()
    dist.destroy_process_group()
    return True


def exit_process(code: int) -> None:
    """End a torchrun rank now, with ``code``, skipping the interpreter's teardown.

    Even after :func:`shutdown_distributed`, a rank that had written everything could still die at exit
    with "terminate called without an active exception" (SIGABRT, no Python frame): a native
    destructor run during interpreter finalization (three times in about fifteen clean-clone CI
    runs, in the two-process FSDP and gloo + Ray tests). Everything a run writes is closed by then
    (checkpoints, rollout store, metrics, trackers), so the rank flushes its streams and logging,
    stops Ray if it started it, and exits without running native destructors.
    """
    import logging

    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        ray.shutdown()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def trainable_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The trainable parameters by name, detached, on the CPU (what a rollout worker loads after an
    update; ``ray.put`` copies them). A sharded (FSDP) model's are streamed to rank 0 one parameter at a
    time (:func:`grpokit.distributed.fsdp.stream_full_parameters`; collective; {} on other ranks)."""
    from grpokit.distributed.fsdp import stream_full_parameters

    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    if is_sharded(model):
        # streamed: one whole parameter at a time on the device (every rank takes part), kept on rank 0's CPU only
        main = dist.get_rank() == 0
        state = {}
        for name, full in stream_full_parameters(model, trainable):
            if main:
                state[name] = full.cpu()
        return state
    return {name: p.detach().cpu() for name, p in model.named_parameters() if name in trainable}
