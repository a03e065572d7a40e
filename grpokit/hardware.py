"""Device and dtype choice: CUDA (bf16 where supported), then MPS, then CPU float32."""

from __future__ import annotations

import torch

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


def cpu_supports_bf16() -> bool:
    """True when this x86 CPU has native bf16 matmul (AVX512-BF16 or AMX)."""
    try:
        flags = open("/proc/cpuinfo").read()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags
