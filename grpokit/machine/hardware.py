"""Device and dtype choice: CUDA, then MPS, then CPU; float32 weights everywhere under ``dtype: auto`` and a compute
dtype through autocast (bf16 on GPUs and CPUs that have it natively, fp16 on older GPUs), by the one rule of
:mod:`grpokit.machine.precision`."""

from __future__ import annotations

import contextlib

import torch

from grpokit.machine.cpu_caps import cpu_caps
from grpokit.machine.precision import DTYPES, MIN_AUTOCAST_PARAMS, choose_precision

__all__ = ["DTYPES", "MIN_AUTOCAST_PARAMS", "autocast", "autocast_dtype", "pick_device", "pick_dtype"]


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
    """Weights dtype (:func:`grpokit.machine.precision.choose_precision`): ``auto`` is float32 on every device;
    the speed of bf16 comes from autocast (see :func:`autocast_dtype`), not from bf16 weights."""
    return choose_precision(requested, device).weights


def slow_dtype_warning(requested: str, device: torch.device) -> str | None:
    """Why ``requested`` will be slow on ``device``, or None: bf16 on a CPU without native bf16 matmul."""
    if requested != "bfloat16" or device.type != "cpu" or cpu_caps().native_bf16:
        return None
    return (
        "dtype=bfloat16 on a CPU without native bf16 matmul (no AVX512-BF16 or AMX-BF16): its bf16 matmuls are "
        "emulated and run slower than float32. The results are correct; dtype=auto (float32 here) is faster."
    )


def autocast_dtype(
    requested: str, device: torch.device, model: torch.nn.Module | None = None, mixed_precision: str = "auto"
) -> torch.dtype | None:
    """The dtype of the autocast regions (generation, log-prob passes, forward and backward), or None: the weights'
    dtype is the compute dtype. A run on a CPU under ``mixed_precision: auto`` measures instead
    (:func:`grpokit.kernels.cpu_precision.run_compute`, which falls back to this rule for several processes or a failed
    probe). The rule is :func:`~grpokit.machine.precision.choose_precision`'s: under ``dtype: auto``, bf16
    on a GPU with native bf16 (else fp16, with a GradScaler), bf16 on a CPU with native bf16 matmul for a model of at
    least ``MIN_AUTOCAST_PARAMS`` parameters; TRL's ``bf16``/``fp16`` (``mixed_precision``) on any device. Matmuls
    run in the compute dtype with float32 accumulation; weights, gradients, optimizer state, norms, softmax and the
    loss stay float32."""
    num_params = None if model is None else sum(p.numel() for p in model.parameters())
    return choose_precision(
        requested, device, mixed_precision=mixed_precision, num_params=num_params, cpu_bf16=cpu_caps().native_bf16
    ).compute


def autocast(device: torch.device, dtype: torch.dtype | None):
    """``torch.autocast`` to ``dtype`` on ``device``, or a no-op context when ``dtype`` is None."""
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)
