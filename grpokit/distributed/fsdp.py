"""FSDP (``distributed.strategy: fsdp``): parameters, gradients and AdamW states sharded over ranks.

torch's FSDP2 (``torch.distributed.fsdp.fully_shard``): each decoder layer (the classes an HF model
lists in ``_no_split_modules``) is one unit, the root holds the rest (embeddings, final norm, head);
a custom module without that list is one unit. A unit's parameters are all-gathered for its forward
and backward and freed afterwards; gradients are reduce-scattered (averaged over ranks, like DDP).
Runs on CUDA with NCCL and on CPU with gloo.

Loading: no rank but rank 0 ever holds the whole model. Rank 0 loads the weights on the CPU; every other rank builds
the model on the meta device (no memory) (:func:`initial_placement`). :func:`shard_from_rank0` shards both the same
way, gives the meta ranks empty shards on their device, and fills every shard from rank 0's full state dict
(``set_model_state_dict(..., StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))``), buffers
broadcast after. Under mixed precision (:mod:`grpokit.precision`) the units gather their parameters in the compute
dtype and reduce gradients in float32 (``MixedPrecisionPolicy``); the sharded master weights and AdamW stay float32.

Weights leaving the learner (:func:`stream_full_parameters`) go one parameter at a time: each is all-gathered, handed
over and dropped before the next, as TRL streams FSDP2 weights into vLLM; the Ray rollout workers' copy is built so.

Passes that every rank runs the same number of times (training micro-batches, the reference and
old-policy passes) go through the sharded module as it is. Generation and evaluation do not: a
rank samples until its own rows finish, so ranks make different numbers of forward calls, which
per-call all-gathers cannot match. :func:`unsharded` gathers every unit once, on every rank, and
keeps the full weights until the block ends, so sampling makes no collective call: grpokit's own
engine (``generation.engine: hf``) therefore holds the whole model on every rank while it samples
(in the compute dtype under mixed precision). Training, the reference pass and the optimizer never do.

Every function here that gathers is collective: all ranks must call it at the same point.
"""

from __future__ import annotations

import contextlib

import torch

from grpokit.processes import is_sharded


def initial_placement(*, strategy: str, world_size: int, rank: int, plain_load: bool) -> torch.device | None:
    """Where a torchrun rank loads the policy before FSDP shards it: rank 0 on the CPU (its shards then move to its
    GPU), every other rank on the meta device; None (the run's device, as without FSDP) for one process, DDP, or a
    load that cannot start on meta (``plain_load`` False: 4-bit, LoRA, a critic copied from the policy)."""
    if strategy != "fsdp" or world_size <= 1 or not plain_load:
        return None
    return torch.device("cpu" if rank == 0 else "meta")


def shard_model(model: torch.nn.Module, mp_policy=None) -> torch.nn.Module:
    """Shard ``model`` in place (its class becomes an FSDP subclass; parameters become DTensors); ``mp_policy``: a
    ``MixedPrecisionPolicy`` (:func:`grpokit.precision.fsdp_mixed_precision`) or None."""
    from torch.distributed.fsdp import fully_shard

    kw = {} if mp_policy is None else {"mp_policy": mp_policy}
    layer_classes = set(getattr(model, "_no_split_modules", None) or [])
    for module in model.modules():
        if type(module).__name__ in layer_classes:
            fully_shard(module, **kw)
    fully_shard(model, **kw)
    if not any(p.requires_grad for p in model.parameters()):
        # fully_shard keeps the root's parameters gathered from forward until backward; a frozen model
        # (the reference) has no backward, so they would stay gathered: free them after each forward
        model.set_reshard_after_forward(True)
    return model


def shard_from_rank0(model: torch.nn.Module, *, is_main: bool, device: torch.device, mp_policy=None) -> torch.nn.Module:
    """Shard ``model`` and load every rank's shard from rank 0's weights (collective). Rank 0's ``model`` holds the
    weights (on the CPU or its device); the others' may be on the meta device (:func:`initial_placement`) or hold
    anything (they are overwritten). Tied weights stay tied (one parameter, sharded once)."""
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import set_model_state_dict

    full = dict(model.state_dict()) if is_main else {}
    shard_model(model, mp_policy)
    if any(t.is_meta for t in (*model.parameters(), *model.buffers())):
        model.to_empty(device=device)
    set_model_state_dict(model, full, options=_options(broadcast_from_rank0=True))
    del full
    with torch.no_grad():
        for buffer in model.buffers():  # not in the state dict when non-persistent (rotary inv_freq)
            dist.broadcast(buffer, src=0)
    return model


def stream_full_parameters(model: torch.nn.Module, names: set[str] | None = None):
    """``(name, full tensor)`` of each parameter of a sharded ``model`` (those in ``names``, default all), one at a
    time: each is all-gathered when the consumer asks for it and free once the consumer lets it go, so no rank holds
    more than one whole parameter beyond its shards (collective: every rank iterates to the end)."""
    for name, param in model.named_parameters():
        if names is not None and name not in names:
            continue
        full = param.full_tensor() if hasattr(param, "full_tensor") else param
        yield name, full.detach()


@contextlib.contextmanager
def unsharded(model: torch.nn.Module):
    """Full parameters in place inside the block, forward calls without collectives; a no-op for an
    unsharded model. Memory: the whole model per rank while the block is open."""
    if not is_sharded(model):
        yield
        return
    from torch.distributed.fsdp import FSDPModule

    units = [m for m in model.modules() if isinstance(m, FSDPModule)]
    for unit in units:
        unit.unshard()
    model.set_reshard_after_forward(False)
    try:
        yield
    finally:
        model.set_reshard_after_forward(True)
        # the root keeps its parameters from forward to backward, as fully_shard sets it
        model.set_reshard_after_forward(False, recurse=False)
        for unit in units:
            unit.reshard()


def _options(**kw):
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, **kw)


def full_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The whole model's state dict on rank 0's CPU, {} on other ranks (collective)."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    return get_model_state_dict(model, options=_options(cpu_offload=True))


def full_optimizer_state(model: torch.nn.Module, optimizer) -> dict:
    """The optimizer state with full tensors keyed by parameter name, on rank 0's CPU, {} elsewhere (collective)."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    return get_optimizer_state_dict(model, optimizer, options=_options(cpu_offload=True))


def load_full_state(
    model: torch.nn.Module, state: dict[str, torch.Tensor], optimizer=None, optimizer_state: dict | None = None
) -> tuple[list[str], list[str]]:
    """Load a full state dict (and optimizer state) that every rank holds into the sharded model, each
    rank keeping its shard (collective). Returns (missing keys, unexpected keys); the optimizer state
    is loaded only when both match."""
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict

    result = set_model_state_dict(model, state, options=_options(strict=False))
    if result.missing_keys or result.unexpected_keys:
        return list(result.missing_keys), list(result.unexpected_keys)
    if optimizer is not None:
        set_optimizer_state_dict(model, optimizer, optimizer_state, options=_options())
    return [], []
