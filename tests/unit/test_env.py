"""`grpokit env`: versions, hardware and what grpokit would pick, honouring the forced CPU probe."""

import platform
import re
import sys
from pathlib import Path

import pytest
import torch

import grpokit
from grpokit.cli import main
from grpokit.kernels import cpu_precision
from grpokit.kernels.cpu_probe import candidates


class FixedRates:
    """The precision probe's measurements, fixed (no test times this machine), counting the probes."""

    def __init__(self, learning_bf16: float = 77.0):
        self.learning_bf16, self.calls = learning_bf16, 0

    def __call__(self, shapes, caps, learn_rows, sample_rows):
        self.calls += 1
        learning, sampling = candidates(caps)
        rates = {"float32": 120.0, "bf16": self.learning_bf16}
        return {"learning": {p: rates[p] for p in learning}, "sampling": {p: 100.0 for p in sampling}}


@pytest.fixture(autouse=True)
def rates(monkeypatch, tmp_path):
    monkeypatch.setenv("GRPOKIT_CACHE", str(tmp_path / "cache"))
    fixed = FixedRates()
    monkeypatch.setattr(cpu_precision, "measure", fixed)
    monkeypatch.setattr(cpu_precision, "_load", lambda: 0.5)  # a quiet machine: results kept
    return fixed


def env_lines(capsys, *args: str) -> dict[str, str]:
    assert main(["env", *args]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert all(line.startswith("- ") for line in lines)
    return dict(line[2:].split(": ", 1) for line in lines)


def test_versions_system_and_hardware(capsys, monkeypatch):
    monkeypatch.delenv("GRPOKIT_CPU_CAPS", raising=False)
    info = env_lines(capsys)
    assert info["grpokit"] == grpokit.__version__
    assert info["Python"].startswith(platform.python_version()) and sys.executable in info["Python"]
    assert f"torch {torch.__version__}" in info["dependencies"]
    assert "transformers " in info["dependencies"]
    assert re.search(r"lora: peft (\d|not installed)", info["extras"])
    assert f"{torch.get_num_threads()} threads" in info["CPU"]
    assert re.fullmatch(r"[\d.]+ GiB total, ([\d.]+ GiB|unknown) available", info["memory"])
    auto = "cuda" if torch.cuda.is_available() else "mps" if torch.backends.mps.is_available() else "cpu"
    assert info["device (auto)"] == auto


@pytest.mark.skipif(
    not sys.platform.startswith("linux") or platform.machine() != "x86_64", reason="reads x86 /proc/cpuinfo"
)
def test_instruction_sets_are_this_cpus(capsys, monkeypatch):
    monkeypatch.delenv("GRPOKIT_CPU_CAPS", raising=False)
    flags = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags")).split()
    info = env_lines(capsys)
    assert f"AVX2 {'yes' if 'avx2' in flags else 'no'}" in info["CPU instruction sets"]
    assert f"AVX512-BF16 {'yes' if 'avx512_bf16' in flags else 'no'}" in info["CPU instruction sets"]
    assert f"AMX {'yes' if 'amx_bf16' in flags else 'no'}" in info["CPU instruction sets"]
    assert f"oneDNN bf16 {'yes' if torch.ops.mkldnn._is_mkldnn_bf16_supported() else 'no'}" in info["torch CPU kernels"]


@pytest.mark.skipif(torch.cuda.is_available() or torch.backends.mps.is_available(), reason="describes CPU training")
def test_a_forced_avx2_only_cpu_is_reported_with_its_choices(capsys, monkeypatch):
    if platform.machine() != "x86_64":
        pytest.skip("simulates an x86-64 CPU: needs one")
    monkeypatch.setenv("GRPOKIT_CPU_CAPS", "avx2")
    info = env_lines(capsys)
    assert info["CPU instruction sets"].startswith("AVX2 yes, AVX-512 no, AVX512-BF16 no, AMX no")
    assert info["CPU instruction sets"].endswith("(restricted by GRPOKIT_CPU_CAPS=avx2)")
    assert info["weights with dtype auto"] == "float32"
    for phase in ("learning", "sampling"):  # one path: nothing to measure
        assert info[f"mixed_precision auto, {phase}"].startswith("float32 (float32: the only path here (no oneDNN bf16")
    assert info["precision probe"].startswith("on a Qwen2.5-0.5B-shaped model's matmuls, not measured")
    assert info["with dtype bfloat16"] == "runs, emulated: slower than float32"
    assert info["oneDNN weight packing"] == "float32"
    # Kernels.select's choice for a float32 run here: packed sampling weights, no bf16 reference storage
    fast = info["fast paths"].split(", ")
    assert "oneDNN-packed weights for sampling" in fast and "fused LM head" in fast
    assert "plain attention for small learner calls" in fast
    assert not any("autocast" in f for f in fast)
    monkeypatch.setenv("GRPOKIT_CPU_CAPS", "aarch64")
    info = env_lines(capsys)
    assert info["oneDNN weight packing"] == "no (F.linear)"
    assert "oneDNN-packed weights for sampling" not in info["fast paths"]
    assert info["CPU instruction sets"].startswith("aarch64: NEON no")


@pytest.mark.skipif(torch.cuda.is_available() or torch.backends.mps.is_available(), reason="describes CPU training")
def test_native_bf16_cpu_choices(capsys, monkeypatch, rates):
    from grpokit.commands import env_report as env
    from grpokit.machine import cpu_caps

    flags = frozenset({"avx2", "avx512f", "avx512bw", "avx512vl", "avx512dq", "amx_bf16"})
    sapphire_rapids = cpu_caps.CpuCaps(
        "x86_64", "Xeon", flags, onednn=True, onednn_bf16=True, torch_capability="AVX512"
    )
    monkeypatch.setattr(env, "cpu_caps", lambda: sapphire_rapids)
    monkeypatch.setattr(cpu_precision, "cpu_caps", lambda: sapphire_rapids)
    slow = env_lines(capsys)  # the VM: bf16 slower than float32 despite the flags
    assert slow["mixed_precision auto, learning"] == "float32 (bf16 77 GFLOP/s < float32 120: float32)"
    assert "oneDNN-packed weights for sampling" in slow["fast paths"]
    rates.learning_bf16 = 862.0
    again = env_lines(capsys)
    assert rates.calls == 1 and "cached in" in again["precision probe"]  # the second run measured nothing
    info = env_lines(capsys, "--probe")  # measured again: now bf16 is faster
    assert rates.calls == 2 and "cleared 1 cached result(s)" in info["precision probe"]
    assert info["mixed_precision auto, learning"] == "bf16 (float32 120 GFLOP/s < bf16 862: bf16)"
    assert info["mixed_precision auto, sampling"].startswith("float32 (bf16 100 GFLOP/s is within 5%")
    assert info["oneDNN weight packing"] == "float32, bf16"
    assert "AMX yes" in info["CPU instruction sets"]
    # under bf16 autocast the run packs nothing (each call would cast and pack again) and stores the reference's
    # Linear weights in bf16; smaller models run float32, with packed sampling weights
    large, small = info["fast paths (>= 10M parameters, learning)"], info["fast paths (< 10M parameters)"]
    assert "reference Linear weights in the autocast dtype" in large and "oneDNN-packed" not in large
    assert "oneDNN-packed weights for sampling" in small and "autocast" not in small
