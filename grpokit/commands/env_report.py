"""`grpokit env`: the facts a bug report needs, as ``trl env`` and ``transformers env`` print them.

Versions (grpokit, its dependencies, the optional extras that are installed), Python and the OS, the
CPU (model, the instruction sets the fast paths depend on, cores, memory, whether PyTorch asks for huge pages),
CUDA, the GPUs, vLLM and flash-attention (:mod:`grpokit.machine.gpu_caps`, with a warning line for each mismatch that
breaks a GPU run), and what grpokit would choose on this machine: device, dtype, bf16 autocast and the fast paths,
all from the same probes and choice training uses (:mod:`grpokit.machine.hardware`, :mod:`grpokit.machine.cpu_caps`,
:meth:`grpokit.kernels.Kernels.select`), so ``GRPOKIT_CPU_CAPS`` shows here too.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import re
import sys

import torch

from grpokit.kernels import Kernels
from grpokit.kernels.allocator import HUGE_PAGES_ENV, huge_pages_in_use, system_huge_pages
from grpokit.kernels.cpu_precision import env_lines, forced_choice
from grpokit.machine.cpu_caps import ENV, cpu_caps, describe
from grpokit.machine.gpu_caps import gpu_caps, gpu_lines, gpu_warnings
from grpokit.machine.hardware import MIN_AUTOCAST_PARAMS, pick_device, pick_dtype
from grpokit.memory.fit import available_bytes
from grpokit.rollout import engine_choice
from grpokit.version import __version__


def _requirements() -> tuple[list[str], dict[str, list[str]]] | None:
    """(core dependency names, {extra: names}) from grpokit's installed metadata, or None when not installed."""
    try:
        requires = importlib.metadata.requires("grpokit") or []
    except importlib.metadata.PackageNotFoundError:
        return None
    core, extras = [], {}
    for requirement in requires:
        name = re.split(r"[\s<>=!~;\[]", requirement, maxsplit=1)[0]
        extra = re.search(r"extra\s*==\s*['\"]([^'\"]+)['\"]", requirement)
        if extra:
            extras.setdefault(extra.group(1), []).append(name)
        else:
            core.append(name)
    return core, extras


def _version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _gib(n: int | None) -> str:
    return "unknown" if n is None else f"{n / 2**30:.1f} GiB"


def _total_memory() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


def report(probe: bool = False) -> dict[str, str]:
    """The report as ordered ``label -> value`` pairs (``probe``: measure the CPU's compute paths again)."""
    out = {
        "grpokit": __version__,
        "Python": f"{platform.python_version()} ({sys.executable})",
        "OS": platform.platform(),
    }
    requirements = _requirements()
    if requirements is None:
        out["dependencies"] = "unknown: grpokit is not installed (pip install -e .)"
    else:
        core, extras = requirements
        out["dependencies"] = ", ".join(f"{n} {_version(n) or 'MISSING'}" for n in core)
        out["extras"] = "; ".join(
            f"{extra}: " + ", ".join(f"{n} {_version(n) or 'not installed'}" for n in names)
            for extra, names in extras.items()
        )
    caps = cpu_caps()
    out["CPU"] = (
        f"{caps.model or 'unknown model'} ({caps.machine}), {os.cpu_count()} cores, "
        f"torch uses {torch.get_num_threads()} threads"
    )
    out["CPU instruction sets"] = describe(caps) + (f" (restricted by {ENV}={caps.forced})" if caps.forced else "")
    out["torch CPU kernels"] = (
        f"{caps.torch_capability}, oneDNN {'yes' if caps.onednn else 'no'}, "
        f"oneDNN bf16 {'yes' if caps.onednn_bf16 else 'no'}"
    )
    out["memory"] = f"{_gib(_total_memory())} total, {_gib(available_bytes(torch.device('cpu')))} available"
    out["huge pages"] = (
        f"{'asked' if huge_pages_in_use() else 'not asked'} for tensors >= 2 MB "
        f"({HUGE_PAGES_ENV}={os.environ.get(HUGE_PAGES_ENV, 'unset')}; the grpokit command sets 1 unless given), "
        f"kernel mode {system_huge_pages() or 'unknown'}"
    )
    gpu = gpu_caps()
    out.update(gpu_lines(gpu))
    out["MPS"] = "available" if torch.backends.mps.is_available() else "no"
    out.update(choices(probe))
    for n, warning in enumerate(gpu_warnings(gpu), 1):
        out[f"warning {n}"] = warning
    return out


def choices(probe: bool = False) -> dict[str, str]:
    """What training would pick here with ``device: auto`` and ``dtype: auto`` (and with ``dtype: bfloat16``): on a
    CPU, the measured compute choice (:mod:`grpokit.kernels.cpu_precision`; ``probe``: measured again).

    No label holds ": ", so a line splits into label and value at its first one."""
    device = pick_device("auto")
    weights = pick_dtype("auto", device)
    out = {"device (auto)": str(device), "weights with dtype auto": str(weights).replace("torch.", "")}
    cleared = engine_choice.clear_cache() if probe and device.type == "cpu" else 0
    out["generation.engine auto"] = engine_choice.env_line(device.type) + (
        f" (--probe cleared {cleared} cached measurement(s))" if cleared else ""
    )
    if device.type != "cpu":
        out["fast paths"] = ", ".join(Kernels.select(device).in_use())
        return out
    caps = cpu_caps()
    lines, measured = env_lines(probe)
    out.update(lines)
    floor = MIN_AUTOCAST_PARAMS // 10**6
    out[f"mixed_precision auto, < {floor}M parameters"] = (
        "float32, not measured: casts cost more than they save"
        if forced_choice() is None
        else "as above (forced at every size)"
    )
    out["with dtype bfloat16"] = "native bf16 matmul" if caps.native_bf16 else "runs, emulated: slower than float32"
    packing = [name for name, dtype in (("float32", torch.float32), ("bf16", torch.bfloat16)) if caps.packs(dtype)]
    out["oneDNN weight packing"] = ", ".join(packing) if packing else "no (F.linear)"
    # the run's own choice (Kernels.select), for the models the measured choice applies to and for the others
    small = Kernels.select(device, measured.learning.dtype if forced_choice() else None, caps)  # forced: every size
    if measured.learning.dtype is not None:
        large = Kernels.select(device, measured.learning.dtype, caps)
        out[f"fast paths (>= {floor}M parameters, learning)"] = ", ".join(large.in_use())
        out[f"fast paths (< {floor}M parameters)"] = ", ".join(small.in_use())
    else:
        out["fast paths"] = ", ".join(small.in_use())
    return out


def format_report(items: dict[str, str]) -> str:
    """``- label: value`` lines, ready to paste into an issue."""
    return "\n".join(f"- {label}: {value}" for label, value in items.items())
