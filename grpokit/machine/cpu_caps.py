"""What this CPU can do: the one probe Kernels.select and every instruction-set-dependent kernel ask.

Two fast paths depend on the instruction set; everything else grpokit runs on CPU (the fused decoder's
and the fused head's matmuls, the learner's attention, the KV cache) is plain PyTorch ops, which
torch dispatches to whatever the CPU has:

- oneDNN weight packing (:mod:`grpokit.kernels.packed_linear`): float32 on any x86-64 CPU; bf16 only
  where oneDNN has bf16 kernels (AVX512BW + AVX512VL + AVX512DQ, or AVX-NE-CONVERT). Elsewhere torch's
  packing op raises ("bf16 path needs the cpu support ..."). Not used on other architectures
  (aarch64: Graviton, Apple silicon), where it was never measured.
- bf16 autocast under ``dtype: auto``: only where bf16 matmuls are native (AVX512-BF16 or AMX-BF16,
  and oneDNN using them). Without them bf16 matmuls are emulated and slower than float32.

``GRPOKIT_CPU_CAPS`` (comma-separated flags, e.g. ``avx2``, or ``aarch64,bf16``) makes grpokit act
as on a CPU with only those flags: tests use it to run the fallbacks of an AVX2-only CPU on a bigger
one, and a user can use it to rule a fast path out. It only takes capabilities away (the listed
flags are intersected with the real ones), so it can never select an op the CPU lacks.
"""

from __future__ import annotations

import functools
import os
import platform
from dataclasses import dataclass, replace

import torch

ENV = "GRPOKIT_CPU_CAPS"
# The x86 flags (as /proc/cpuinfo spells them) the fast paths and `grpokit env` look at.
X86_FLAGS = (
    "avx2",
    "avx512f",
    "avx512bw",
    "avx512vl",
    "avx512dq",
    "avx512_bf16",
    "amx_bf16",
    "avx_ne_convert",
    "avx512_fp16",  # fp16 matmul: a sampling candidate of the precision probe (grpokit/kernels/cpu_probe.py)
)
ARM_FLAGS = ("asimd", "sve", "bf16")
ARM = ("aarch64", "arm64")
# torch's dispatch level (torch.backends.cpu.get_cpu_capability) -> the flags it implies, where
# /proc/cpuinfo is missing (macOS, Windows).
_IMPLIED = {"AVX2": ("avx2",), "AVX512": ("avx2", "avx512f", "avx512bw", "avx512vl", "avx512dq")}


@dataclass(frozen=True)
class CpuCaps:
    """The CPU as the fast paths see it."""

    machine: str  # x86_64, aarch64, arm64, ...
    model: str  # the CPU's model name, "" if unknown
    flags: frozenset[str]  # those of X86_FLAGS / ARM_FLAGS this CPU has
    onednn: bool  # torch is built with oneDNN and has its Linear packing ops
    onednn_bf16: bool  # oneDNN runs bf16 here (torch.ops.mkldnn._is_mkldnn_bf16_supported)
    torch_capability: str  # torch's kernel dispatch level: DEFAULT, AVX2, AVX512, SVE256, ...
    forced: str | None = None  # the GRPOKIT_CPU_CAPS value, if set

    @property
    def x86(self) -> bool:
        return self.machine.lower() in ("x86_64", "amd64", "x86", "i686")

    @property
    def avx512(self) -> bool:
        """AVX-512 foundation with the BW/VL/DQ subsets oneDNN's bf16 kernels need."""
        return {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= self.flags

    @property
    def native_bf16(self) -> bool:
        """bf16 matmuls run natively (AVX512-BF16 or AMX-BF16 through oneDNN): bf16 autocast pays off."""
        return self.x86 and self.onednn_bf16 and bool({"avx512_bf16", "amx_bf16"} & self.flags)

    def packs(self, dtype: torch.dtype) -> bool:
        """Whether oneDNN can pack Linear weights in ``dtype`` here (see the module docstring)."""
        if not (self.x86 and self.onednn):
            return False
        return dtype == torch.float32 or (dtype == torch.bfloat16 and self.onednn_bf16)


def cpu_caps() -> CpuCaps:
    """This CPU's capabilities, restricted by ``GRPOKIT_CPU_CAPS`` when it is set."""
    real = _detected()
    forced = os.environ.get(ENV, "").strip()
    if not forced:
        return real
    names = {f.strip().lower() for f in forced.split(",") if f.strip()}
    machine = "aarch64" if names & set(ARM) else real.machine  # naming an Arm architecture simulates one
    caps = replace(real, machine=machine, flags=frozenset(names & real.flags), forced=forced)
    # oneDNN's bf16 check (torch's mkldnn_bf16_device_check): AVX512BW/VL/DQ or AVX-NE-CONVERT
    return replace(caps, onednn_bf16=real.onednn_bf16 and caps.x86 and (caps.avx512 or "avx_ne_convert" in caps.flags))


@functools.lru_cache(maxsize=1)
def _detected() -> CpuCaps:
    machine = platform.machine() or "unknown"
    model, cpu_flags = _proc_cpuinfo()
    known = X86_FLAGS + ARM_FLAGS
    capability = _torch_capability()
    if cpu_flags is None:
        cpu_flags = set(_IMPLIED.get(capability, ()))
    onednn = (
        torch.backends.mkldnn.is_available()
        and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
        and hasattr(torch.ops.mkldnn, "_linear_pointwise")
    )
    try:
        onednn_bf16 = onednn and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        onednn_bf16 = False
    return CpuCaps(
        machine=machine,
        model=model or platform.processor(),
        flags=frozenset(f for f in cpu_flags if f in known),
        onednn=onednn,
        onednn_bf16=onednn_bf16,
        torch_capability=capability,
    )


def _proc_cpuinfo() -> tuple[str, set[str] | None]:
    """(model name, flags) from Linux's /proc/cpuinfo ("flags" on x86, "Features" on Arm); ("", None) elsewhere."""
    try:
        with open("/proc/cpuinfo") as f:
            text = f.read()
    except OSError:
        return "", None
    model, flags = "", None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip().lower()
        if key in ("model name", "cpu model") and not model:
            model = value.strip()
        elif key in ("flags", "features") and flags is None:
            flags = set(value.split())
    return model, flags


def _torch_capability() -> str:
    try:
        return str(torch.backends.cpu.get_cpu_capability())
    except (AttributeError, RuntimeError):
        return "unknown"


def describe(caps: CpuCaps) -> str:
    """One line naming the instruction sets that matter, e.g. ``AVX2 yes, AVX-512 no, AVX512-BF16 no, AMX no``."""

    def yes(flag: bool) -> str:
        return "yes" if flag else "no"

    if not caps.x86:
        return (
            f"{caps.machine}: NEON {yes('asimd' in caps.flags)}, SVE {yes('sve' in caps.flags)}, "
            f"BF16 {yes('bf16' in caps.flags)}"
        )
    return (
        f"AVX2 {yes('avx2' in caps.flags)}, AVX-512 {yes(caps.avx512)}, "
        f"AVX512-BF16 {yes('avx512_bf16' in caps.flags)}, AMX {yes('amx_bf16' in caps.flags)}, "
        f"AVX-NE-CONVERT {yes('avx_ne_convert' in caps.flags)}"
    )
