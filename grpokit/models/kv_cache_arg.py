"""The KV cache argument of a Hugging Face forward, under its name of the installed transformers.

transformers renames the forward's ``past_key_values`` argument (and output field) to ``cache``: from 5.24 the old
name warns on every call ("`past_key_values` is deprecated and will be removed in version 5.40.0 ... Use `cache`
instead"), and 5.40 drops it. :func:`cache_kwargs` passes the cache under the name the model's forward declares
(``cache`` where it exists, else ``past_key_values``: 5.23, the version pinned in constraints.txt), and
:func:`output_cache` reads it back from either field.
"""

from __future__ import annotations

import functools
import inspect

import torch


def _inner(model: torch.nn.Module) -> torch.nn.Module:
    """The module whose forward declares the arguments: under DDP's ``module`` and peft's base model."""
    model = getattr(model, "module", model)  # DDP
    base = getattr(model, "get_base_model", None)  # peft
    return base() if callable(base) else model


@functools.lru_cache(maxsize=64)
def _takes_cache(forward) -> bool:
    try:
        return "cache" in inspect.signature(forward).parameters
    except (TypeError, ValueError):
        return False


def cache_name(model: torch.nn.Module) -> str:
    """``cache`` when ``model``'s forward takes it (transformers >= the rename), else ``past_key_values``."""
    return "cache" if _takes_cache(type(_inner(model)).forward) else "past_key_values"


def cache_kwargs(model: torch.nn.Module, cache) -> dict:
    """``{name: cache}`` for ``model(**inputs, **cache_kwargs(model, cache))``."""
    return {cache_name(model): cache}


def output_cache(out):
    """The KV cache of a forward's output, under the new field or the old."""
    cache = getattr(out, "cache", None)
    return cache if cache is not None else out.past_key_values
