"""Mixed precision, one rule for every device: float32 master weights and optimizer state, a lower compute dtype
through autocast.

As TRL (fp32 weights, ``bf16=True`` autocast), verl (fp32 actor under FSDP mixed precision) and OpenRLHF (fp32
master weights) train. bf16 weights with a bf16 AdamW lose small updates to rounding: a bf16 weight w only moves
when lr * update exceeds half its ulp (|w| * 2^-8), so at lr 1e-6 most elements never change. Measured on this
project's CPU (tests/unit/test_precision.py repeats it): after 10 AdamW steps at lr 1e-6, 98 % of a bf16 896x896
matrix was unchanged; with float32 weights and bf16 autocast every element changed and the moments were float32.

:func:`choose_precision` is the rule (``dtype``: the weights; ``mixed_precision``: the autocast dtype):

- ``dtype: auto`` -> float32 weights everywhere, and the compute dtype by ``mixed_precision: auto``: on CUDA bf16
  where the GPU has it natively (``is_bf16_supported(including_emulation=False)``: Ampere and later), else fp16 with
  a GradScaler; on a CPU with native bf16 matmul (AVX512-BF16 / AMX, :mod:`grpokit.machine.cpu_caps`) bf16 for
  models of at least :data:`MIN_AUTOCAST_PARAMS` parameters; elsewhere none (float32). A flag is not a speed: a run
  on a CPU measures instead (:mod:`grpokit.kernels.cpu_precision`) and keeps this flag rule for several processes
  and a failed probe.
- ``mixed_precision: bf16 | fp16`` (TRL's ``bf16=True`` / ``fp16=True``): that autocast dtype over float32 weights,
  on any device; ``no``: no autocast.
- ``dtype: bfloat16 | float16``: the weights themselves in that dtype, no autocast (what a user asks for to save
  memory; for full fine-tuning :func:`low_precision_weights_warning` says what it costs).

On CUDA, float32 matmuls use TF32 (:func:`enable_tf32`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
MIXED = {"bf16": torch.bfloat16, "fp16": torch.float16}
# Below this many parameters, bf16 autocast on CPU costs more (casts, small matmuls) than it saves.
MIN_AUTOCAST_PARAMS = 10_000_000


@dataclass(frozen=True)
class Precision:
    """weights: the dtype of the trained weights, their gradients and AdamW's moments. compute: the autocast dtype
    (None: the weights' dtype). grad_scaler: fp16 autocast on CUDA needs a loss scale (fp16's range underflows
    small gradients). tf32: float32 matmuls run in TF32 (CUDA)."""

    weights: torch.dtype
    compute: torch.dtype | None
    grad_scaler: bool
    tf32: bool


def cuda_native_bf16() -> bool:
    """The current GPU computes bf16 natively (compute capability 8.0+). torch's default ``is_bf16_supported()``
    also counts emulation, which says yes on a V100 or T4, where bf16 runs slower than fp16."""
    return torch.cuda.is_available() and torch.cuda.is_bf16_supported(including_emulation=False)


def choose_precision(
    dtype: str, device: torch.device, *, mixed_precision: str = "auto", num_params: int | None = None, cpu_bf16=None
) -> Precision:
    """The precision of a run (module docstring). ``num_params``: the model's size (None: unknown, taken as large);
    ``cpu_bf16``: whether the CPU has native bf16 matmul (default: :func:`grpokit.machine.cpu_caps.cpu_caps`)."""
    if dtype != "auto":
        weights = DTYPES[dtype]
        compute = MIXED.get(mixed_precision) if weights == torch.float32 else None
    else:
        weights = torch.float32
        compute = MIXED.get(mixed_precision)
        if mixed_precision == "auto":
            compute = _auto_compute(device, num_params, cpu_bf16)
    return Precision(
        weights=weights,
        compute=compute,
        grad_scaler=compute == torch.float16 and device.type == "cuda",
        tf32=device.type == "cuda" and weights == torch.float32,
    )


def _auto_compute(device: torch.device, num_params: int | None, cpu_bf16) -> torch.dtype | None:
    if device.type == "cuda":
        return torch.bfloat16 if cuda_native_bf16() else torch.float16
    if device.type != "cpu":
        return None  # MPS: not measured, float32
    if cpu_bf16 is None:
        from grpokit.machine.cpu_caps import cpu_caps

        cpu_bf16 = cpu_caps().native_bf16
    if not cpu_bf16 or (num_params is not None and num_params < MIN_AUTOCAST_PARAMS):
        return None
    return torch.bfloat16


def enable_tf32(precision: Precision) -> None:
    """TF32 for float32 matmuls and convolutions on CUDA (Ampere and later; a no-op elsewhere), as TRL's ``tf32``."""
    if precision.tf32:
        torch.backends.cuda.matmul.fp32_precision = "tf32"
        torch.backends.cudnn.conv.fp32_precision = "tf32"


def grad_scaler(device: torch.device, compute: torch.dtype | None) -> torch.amp.GradScaler:
    """A GradScaler, enabled only for fp16 autocast on CUDA (disabled: scale, unscale_ and update do nothing and
    step is ``optimizer.step()``)."""
    enabled = compute == torch.float16 and device.type == "cuda"
    return torch.amp.GradScaler(device.type if enabled else "cpu", enabled=enabled)


def low_precision_weights_warning(dtype: str, full_fine_tuning: bool) -> str | None:
    """Why bf16/fp16 weights are a bad idea for full fine-tuning, or None (float32 / auto weights, or LoRA, whose
    adapters peft keeps in float32)."""
    if dtype not in ("bfloat16", "float16") or not full_fine_tuning:
        return None
    return (
        f"dtype={dtype} trains {dtype} weights with {dtype} AdamW moments: updates smaller than the weights' rounding "
        "are lost (measured: after 10 steps at lr 1e-6, 98 % of a bf16 896x896 matrix had not changed). Use dtype: "
        "auto (float32 weights, bf16/fp16 autocast), or LoRA."
    )


def fsdp_mixed_precision(compute: torch.dtype | None):
    """FSDP2's policy under this rule: gathered parameters in the compute dtype, gradients reduced in float32 (the
    sharded master weights and AdamW stay float32); None without a compute dtype."""
    if compute is None:
        return None
    from torch.distributed.fsdp import MixedPrecisionPolicy

    return MixedPrecisionPolicy(param_dtype=compute, reduce_dtype=torch.float32)
