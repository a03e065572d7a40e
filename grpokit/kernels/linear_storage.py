"""Linear weights of a frozen model stored in the autocast dtype."""

from __future__ import annotations

import torch


def store_linears_in(module: torch.nn.Module, dtype: torch.dtype) -> int:
    """Keep the weights and biases of ``module``'s Linear layers in ``dtype``; returns how many were cast.

    For a frozen model that only ever runs under ``autocast(dtype)`` this changes no number: autocast
    casts a Linear's float32 weight and bias to ``dtype`` on every call, and the stored cast is the
    same value. It halves those layers' memory and drops the per-call casts. Layers sharing their
    weight with an embedding (a tied LM head) are left alone: the lookup must stay float32.
    """
    linears = untied_linears(module)
    for linear in linears:
        linear.to(dtype)
    return len(linears)


def untied_linears(module: torch.nn.Module) -> list[torch.nn.Linear]:
    """``module``'s Linear layers, except those sharing their weight with an embedding (a tied LM head)."""
    embedding_weights = {id(m.weight) for m in module.modules() if isinstance(m, torch.nn.Embedding)}
    return [m for m in module.modules() if isinstance(m, torch.nn.Linear) and id(m.weight) not in embedding_weights]
