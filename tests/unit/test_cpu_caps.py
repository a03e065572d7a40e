"""The CPU probe: what each instruction set allows, and GRPOKIT_CPU_CAPS only taking capabilities away."""

import platform
import sys
from pathlib import Path

import pytest
import torch

from grpokit.machine.cpu_caps import X86_FLAGS, CpuCaps, cpu_caps, describe

AVX512 = {"avx2", "avx512f", "avx512bw", "avx512vl", "avx512dq"}


def caps(flags, machine="x86_64", onednn_bf16=True):
    return CpuCaps(machine, "", frozenset(flags), onednn=True, onednn_bf16=onednn_bf16, torch_capability="AVX512")


def test_what_each_cpu_allows():
    zen3 = caps({"avx2"}, onednn_bf16=False)
    assert not zen3.avx512 and not zen3.native_bf16
    assert zen3.packs(torch.float32) and not zen3.packs(torch.bfloat16) and not zen3.packs(torch.float16)
    skylake = caps(AVX512)  # AVX-512 without bf16 instructions: oneDNN packs bf16, but bf16 matmul is emulated
    assert skylake.avx512 and skylake.packs(torch.bfloat16) and not skylake.native_bf16
    assert not caps(AVX512 - {"avx512dq"}).avx512  # all four subsets are needed
    assert caps(AVX512 | {"avx512_bf16"}).native_bf16 and caps(AVX512 | {"amx_bf16"}).native_bf16
    assert not caps(AVX512 | {"avx512_bf16"}, onednn_bf16=False).native_bf16  # oneDNN not using them: emulated
    graviton3 = caps({"asimd", "sve", "bf16"}, machine="aarch64")
    assert not graviton3.packs(torch.float32) and not graviton3.native_bf16  # x86-only paths stay off on Arm
    assert describe(graviton3) == "aarch64: NEON yes, SVE yes, BF16 yes"
    assert describe(zen3) == "AVX2 yes, AVX-512 no, AVX512-BF16 no, AMX no, AVX-NE-CONVERT no"


def test_forcing_only_takes_away(monkeypatch):
    monkeypatch.delenv("GRPOKIT_CPU_CAPS", raising=False)
    real = cpu_caps()
    assert real.forced is None
    monkeypatch.setenv("GRPOKIT_CPU_CAPS", "avx2, amx_bf16 ,made_up")
    forced = cpu_caps()
    assert forced.flags == frozenset({"avx2", "amx_bf16"} & real.flags)  # never a flag the CPU lacks
    assert forced.forced == "avx2, amx_bf16 ,made_up"
    assert not forced.onednn_bf16 and not forced.packs(torch.bfloat16)  # no AVX512BW/VL/DQ, no AVX-NE-CONVERT
    monkeypatch.setenv("GRPOKIT_CPU_CAPS", ",".join(X86_FLAGS))
    assert cpu_caps().flags == real.flags & frozenset(X86_FLAGS) and cpu_caps().onednn_bf16 == real.onednn_bf16
    monkeypatch.setenv("GRPOKIT_CPU_CAPS", "aarch64")
    arm = cpu_caps()
    assert arm.machine == "aarch64" and not arm.packs(torch.float32) and not arm.native_bf16


@pytest.mark.skipif(
    not sys.platform.startswith("linux") or platform.machine() != "x86_64", reason="reads x86 /proc/cpuinfo"
)
def test_detected_flags_are_this_cpus(monkeypatch):
    monkeypatch.delenv("GRPOKIT_CPU_CAPS", raising=False)
    flags = set(
        next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags"))
        .split(":", 1)[1]
        .split()
    )
    real = cpu_caps()
    assert real.flags == frozenset(flags & set(X86_FLAGS))
    assert real.onednn_bf16 == torch.ops.mkldnn._is_mkldnn_bf16_supported()
    assert real.torch_capability == torch.backends.cpu.get_cpu_capability()
