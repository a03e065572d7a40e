"""Linear layers with pre-packed weights for inference on CPU (oneDNN), same numbers as ``F.linear``.

A decoding step multiplies a few rows (the sequences still running) by every weight of the model.
At that size ``F.linear`` spends much of its time re-laying the weight out for the matmul kernel on
every call: on this project's 2-core benchmark CPU, a [32, 512] x [512, 32000] LM head takes 21 ms
in float32 (7.4 ms in bf16), against 7.1 ms (4.1 ms) with the weight packed once beforehand.
:func:`packed_linears` packs the weights of a model's ``nn.Linear`` layers once, with oneDNN's
own packing (the one ``torch.compile`` uses on CPU after freezing), and routes those layers
through it until the block ends. Results: bitwise those of ``F.linear`` in bf16; in float32 equal
up to rounding (another summation order, ~1e-6 relative).

Where it is used: the rollout engine, for float32 compute of architectures the fused decoder
(:mod:`grpokit.rollout.fused_decoder`, which packs its own fused weights) does not serve. Inside the trainer on the benchmark
model, generation took 2.8 instead of 4.6 s per step in float32; under bf16 autocast (weights cast
and packed every call) it took 2.8 instead of 2.6 s, so not there. The learner's passes do not use
it: in float32 the reference pass was ~15 % faster, but it broke the bitwise-exact resume of a
LoRA run (adapters off by 2e-6), for a reason not yet found.

Only exact ``nn.Linear`` modules are packed (not quantised subclasses); LoRA's inner layers are
plain Linears, so adapters are honoured. Inference only: no autograd through packed layers.
"""

from __future__ import annotations

import contextlib

import torch


def packing_available(device: torch.device) -> bool:
    """Whether this torch build can pack Linear weights for ``device`` (CPU with oneDNN)."""
    return (device.type == "cpu" and torch.backends.mkldnn.is_available()
            and hasattr(torch.ops.mkldnn, "_reorder_linear_weight") and hasattr(torch.ops.mkldnn, "_linear_pointwise"))


class PackedLinear:
    """y = x W^T + b with ``weight`` [out, in] packed once for oneDNN in ``dtype`` (float32 or bf16);
    ``rows`` is the expected rows per call (any count works)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype, rows: int):
        self.dtype = dtype
        self.weight = torch.ops.mkldnn._reorder_linear_weight(weight.detach().to(dtype), rows)
        self.bias = None if bias is None else bias.detach().to(dtype)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x.to(self.dtype), self.weight, self.bias, "none", [], "")


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
    packing is unavailable (not CPU, no oneDNN) and for dtypes it does not serve."""
    linears = [m for m in model.modules() if type(m) is torch.nn.Linear] if packing_available(device) else []
    patched = []
    try:
        for linear in linears:
            wanted = _packing_dtype(linear.weight, dtype)
            if wanted is not None:
                linear.forward = PackedLinear(linear.weight, linear.bias, wanted, rows)  # instance attribute shadows nn.Linear.forward
                patched.append(linear)
        yield len(patched)
    finally:
        for linear in patched:
            del linear.forward

