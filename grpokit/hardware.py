"""Device and dtype choice: CUDA (bf16 where supported), then MPS, then CPU (float32 weights, bf16
autocast where the CPU has native bf16 matmul, as :mod:`grpokit.cpu_caps` reports)."""

from __future__ import annotations

import contextlib

import torch

from grpokit.cpu_caps import cpu_caps

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def pick_device(requested: str = "auto") -> torch.device:
    """The requested device, or the best available one for ``auto``."""
    if requested != "auto":
        device = torch.device(requested)
        if device.type == "cuda" and not torch.cuda.is_available():
            raise RuntimeError(f"device={requested!r} was requested but CUDA is not available; use device=auto or cpu.")
        if device.type == "mps" and not torch.backends.mps.is_available():
            raise RuntimeError(f"device={requested!r} was requested but MPS is not available; use device=auto or cpu.")
        return device
    if torch.cuda.is_available():
        return torch.device("cuda")
    if torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def pick_dtype(requested: str, device: torch.device) -> torch.dtype:
    """Weights dtype. ``auto``: bf16 on CUDA that supports it, float32 elsewhere.

    On CPU, float32 weights keep the optimizer exact; bf16 speed comes from autocast
    (see :func:`autocast_dtype`), not from bf16 weights.
    """
    if requested != "auto":
        return DTYPES[requested]
    if device.type == "cuda" and torch.cuda.is_bf16_supported():
        return torch.bfloat16
    return torch.float32


def slow_dtype_warning(requested: str, device: torch.device) -> str | None:
    """Why ``requested`` will be slow on ``device``, or None: bf16 on a CPU without native bf16 matmul."""
    if requested != "bfloat16" or device.type != "cpu" or cpu_caps().native_bf16:
        return None
    return (
        "dtype=bfloat16 on a CPU without native bf16 matmul (no AVX512-BF16 or AMX-BF16): its bf16 matmuls are "
        "emulated and run slower than float32. The results are correct; dtype=auto (float32 here) is faster."
    )


# Below this many parameters, bf16 autocast on CPU costs more (casts, small matmuls) than it saves.
MIN_AUTOCAST_PARAMS = 10_000_000


def autocast_dtype(requested: str, device: torch.device, model: torch.nn.Module | None = None) -> torch.dtype | None:
    """The dtype of the autocast regions (generation, log-prob passes, forward and backward), or None.

    ``auto`` on a CPU with native bf16 matmul, for a model of at least ``MIN_AUTOCAST_PARAMS``
    parameters: bfloat16 over float32 weights, i.e. mixed precision. Matmuls run in bf16 with
    float32 accumulation; weights, gradients, optimizer state, norms, softmax and the loss stay
    float32. Otherwise None: the weights' dtype (:func:`pick_dtype`) is the compute dtype.
    """
    if requested != "auto" or device.type != "cpu" or not cpu_caps().native_bf16:
        return None
    if model is not None and sum(p.numel() for p in model.parameters()) < MIN_AUTOCAST_PARAMS:
        return None
    return torch.bfloat16


def autocast(device: torch.device, dtype: torch.dtype | None):
    """``torch.autocast`` to ``dtype`` on ``device``, or a no-op context when ``dtype`` is None."""
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)
