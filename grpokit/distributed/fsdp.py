"""FSDP (``distributed.strategy: fsdp``): parameters, gradients and AdamW states sharded over ranks.

torch's FSDP2 (``torch.distributed.fsdp.fully_shard``): each decoder layer (the classes an HF model
lists in ``_no_split_modules``) is one unit, the root holds the rest (embeddings, final norm, head);
a custom module without that list is one unit. A unit's parameters are all-gathered for its forward
and backward and freed afterwards; gradients are reduce-scattered (averaged over ranks, like DDP).
Runs on CUDA with NCCL and on CPU with gloo.

Passes that every rank runs the same number of times (training micro-batches, the reference and
old-policy passes) go through the sharded module as it is. Generation and evaluation do not: a
rank samples until its own rows finish, so ranks make different numbers of forward calls, which
per-call all-gathers cannot match. :func:`unsharded` gathers every unit once, on every rank, and
keeps the full weights until the block ends, so sampling makes no collective call.

Every function here that gathers is collective: all ranks must call it at the same point.
"""

from __future__ import annotations

import contextlib

import torch

from grpokit.processes import is_sharded


def shard_model(model: torch.nn.Module) -> torch.nn.Module:
    """Shard ``model`` in place (its class becomes an FSDP subclass; parameters become DTensors)."""
    from torch.distributed.fsdp import fully_shard

    layer_classes = set(getattr(model, "_no_split_modules", None) or [])
    for module in model.modules():
        if type(module).__name__ in layer_classes:
            fully_shard(module)
    fully_shard(model)
    if not any(p.requires_grad for p in model.parameters()):
        # fully_shard keeps the root's parameters gathered from forward until backward; a frozen model
        # (the reference) has no backward, so they would stay gathered: free them after each forward
        model.set_reshard_after_forward(True)
    return model


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
