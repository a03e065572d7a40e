"""Linear layers with pre-packed weights for inference on CPU (oneDNN), same numbers as ``F.linear``.

A decoding step multiplies a few rows (the sequences still running) by every weight of the model.
At that size ``F.linear`` spends much of its time re-laying the weight out for the matmul kernel on
every call. :func:`pack` lays a weight out once with oneDNN's own packing (the one ``torch.compile``
uses on CPU after freezing); :func:`packed_linears` does so for a model's ``nn.Linear`` layers and
routes those layers through the packed weights until the block ends. Results: bitwise those of
``F.linear`` in bf16; in float32 equal up to rounding (another summation order, ~1e-6 relative).

Users: the fused decoder (:mod:`grpokit.kernels.fused_decoder`) packs its fused weights;
:func:`packed_linears` serves float32 sampling of the architectures the fused decoder does not
(:class:`grpokit.kernels.Kernels` decides where). Not under bf16 autocast, where each call would
cast and pack again. Not in the learner: its training passes need autograd, and packed no-grad
passes made a resumed LoRA run differ from an uninterrupted one (by ~2e-6), which resume must not.
docs/performance.md has the measurements.

Only exact ``nn.Linear`` modules are packed (not quantised subclasses); LoRA's inner layers are
plain Linears, so adapters are honoured. Inference only: no autograd through packed layers.

Which CPUs: :func:`packing_available` asks :func:`grpokit.machine.cpu_caps.cpu_caps` (float32 on x86-64,
bf16 only where oneDNN has bf16 kernels). Should oneDNN still refuse a dtype (when packing, or at the
first call, which :func:`pack` makes once per dtype), :func:`pack` warns once and that dtype stays on
``F.linear`` for the rest of the process: the same numbers, slower. Those two sets (dtypes refused,
dtypes seen working) are per process on purpose: they describe this machine's oneDNN, not a run.
"""

from __future__ import annotations

import contextlib
import warnings

import torch

from grpokit.machine.cpu_caps import cpu_caps

# dtypes oneDNN refused on this machine, and dtypes whose packed layers ran once here (see pack)
_refused: set[torch.dtype] = set()
_working: set[torch.dtype] = set()


def packing_available(device: torch.device, dtype: torch.dtype = torch.float32) -> bool:
    """Whether Linear weights can be packed in ``dtype`` for ``device``: CPU, oneDNN, a CPU it supports."""
    return device.type == "cpu" and dtype not in _refused and cpu_caps().packs(dtype)


def _reorder(weight: torch.Tensor, rows: int) -> torch.Tensor:
    return torch.ops.mkldnn._reorder_linear_weight(weight, rows)


def _linear_pointwise(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


class PackedLinear:
    """y = x W^T + b with ``weight`` [out, in] packed once for oneDNN in ``dtype`` (float32 or bf16);
    ``rows`` is the expected rows per call (any count works)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype, rows: int):
        self.dtype = dtype
        self.weight = _reorder(weight.detach().to(dtype), rows)
        self.bias = None if bias is None else bias.detach().to(dtype)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return _linear_pointwise(x.to(self.dtype), self.weight, self.bias)


def pack(weight: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype, rows: int) -> PackedLinear | None:
    """A :class:`PackedLinear`, or None (the caller uses ``F.linear``) when packing in ``dtype`` is
    unavailable here or oneDNN refuses it, when packing or at the first use (a one-row call, once per
    dtype and process); a refusal is warned about once per dtype."""
    if not packing_available(weight.device, dtype):
        return None
    try:
        packed = PackedLinear(weight, bias, dtype, rows)
        if dtype not in _working:
            packed(weight.new_zeros((1, weight.size(1)), dtype=dtype))
            _working.add(dtype)
        return packed
    except RuntimeError as exc:
        _refused.add(dtype)
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        warnings.warn(
            f"grpokit: oneDNN cannot pack {dtype} Linear weights on this CPU ({reason}); using F.linear "
            "instead (same numbers, slower). `grpokit env` shows what this CPU supports.",
            RuntimeWarning,
            stacklevel=2,
        )
        return None


def _packing_dtype(weight: torch.Tensor, dtype: torch.dtype | None) -> torch.dtype | None:
    """The dtype to pack ``weight`` in (``dtype``, or its own), or None to leave its layer on F.linear."""
    if type(weight.data) is not torch.Tensor or weight.device.type != "cpu":
        return None  # sharded (DTensor) or non-CPU weights
    wanted = dtype or weight.dtype
    if wanted not in (torch.float32, torch.bfloat16) or weight.dtype not in (wanted, torch.float32):
        return None  # oneDNN packs these two; the only cast allowed is float32 -> wanted, as autocast does
    return wanted


@contextlib.contextmanager
def packed_linears(model: torch.nn.Module, dtype: torch.dtype | None, rows: int, device: torch.device):
    """Run ``model``'s Linear layers on weights packed in ``dtype`` (None: each weight's own dtype)
    inside this block; ``rows`` is the expected rows per call (any count works). No-op where
    packing is unavailable (not CPU, no oneDNN, a CPU without the dtype's kernels) and for dtypes it
    does not serve; yields the number of layers packed."""
    linears = [m for m in model.modules() if type(m) is torch.nn.Linear] if device.type == "cpu" else []
    patched = []
    try:
        for linear in linears:
            wanted = _packing_dtype(linear.weight, dtype)
            packed = pack(linear.weight, linear.bias, wanted, rows) if wanted is not None else None
            if packed is not None:
                linear.forward = packed  # instance attribute shadows nn.Linear.forward
                patched.append(linear)
        yield len(patched)
    finally:
        for linear in patched:
            del linear.forward
