"""``mixed_precision: auto`` on a CPU: the compute dtype chosen by timing this machine, not by reading its flags.

On first use on a machine, :func:`cpu_choice` times the candidate paths on the model's own matmul shapes
(:mod:`grpokit.kernels.cpu_probe`: float32, bf16 autocast where oneDNN has bf16 kernels, fp16 for sampling where the CPU
has AVX512-FP16, the packed kernels where they apply) and picks with :func:`choose`, separately for learning (fat
matmuls, forward and backward) and sampling (thin ones): a lower precision is taken only when it is more than
:data:`TIE` times float32's rate; a tie keeps float32. Weights and optimizer state stay float32 in every choice
(:mod:`grpokit.machine.precision`); only the autocast dtype changes.

The rates are cached under the cache folder (:func:`grpokit.system.cached_folders.default_cache_root`,
``$GRPOKIT_CACHE``), in ``cpu-precision/<hash>.json``, one file per CPU model, core count, torch version, forced flags
(``GRPOKIT_CPU_CAPS``), rows and shapes, written atomically (:func:`grpokit.system.cached_folders.write_atomic`): a
later run pays nothing, a run killed while writing leaves no partial file, and an unreadable file is named in one line
and measured again. Rates measured while the load average exceeds the core count are used but not kept (others' work
skews them). ``grpokit env --probe`` clears the cache and measures again (after a hardware change).

Explicit ``mixed_precision`` (``bf16``, ``fp16``, ``no``), a ``dtype`` other than auto, other devices, models under
:data:`grpokit.machine.precision.MIN_AUTOCAST_PARAMS` parameters (float32, unmeasured: casts cost more than they save
there) and runs of several processes (one rule for every rank: the CPU flags, since per-rank timings could disagree)
keep the rule of :mod:`grpokit.machine.precision`. A probe that fails falls back to that rule too, saying why.

``GRPOKIT_CPU_PRECISION`` (:func:`forced_choice`: ``float32``, ``bf16``, or learning/sampling such as ``float32/bf16``)
replaces the whole choice of ``mixed_precision: auto`` on a CPU, at every model size and process count, unmeasured:
what the tests use to run the learning tests with either outcome, and a user to rule the probe out. The rates are
per oneDNN instruction-set cap too (``ONEDNN_MAX_CPU_ISA``, e.g. ``AVX512_CORE_BF16``: a CPU with AVX512-BF16 but no
AMX), since the cap changes them.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch

from grpokit.errors import ConfigError
from grpokit.kernels.cpu_probe import DTYPES, LEARN_ROWS, Shape, candidates, matmul_shapes, measure, reference_shapes
from grpokit.machine.cpu_caps import CpuCaps, cpu_caps
from grpokit.system.cached_folders import default_cache_root, keyed_file, read_keyed, write_atomic

FORCE_ENV = "GRPOKIT_CPU_PRECISION"  # float32 | bf16 | LEARNING/SAMPLING: the choice, unmeasured (forced_choice)
ISA_ENVS = ("ONEDNN_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY")  # caps on the kernels torch runs: part of the cache key
PROBE_VERSION = 2  # bump when what is timed changes: older cached rates are then measured again
TIE = 1.05  # a lower precision must be this many times faster than float32 to be chosen
CACHE_FOLDER = "cpu-precision"
_NAMES = {torch.bfloat16: "bf16", torch.float16: "fp16"}


@dataclass(frozen=True)
class Decision:
    """The compute path of one phase: ``compute`` (float32 | bf16 | fp16), why, and the rates it was chosen from
    (GFLOP/s by path; empty when nothing was measured)."""

    compute: str
    reason: str
    rates: dict = field(default_factory=dict)

    @property
    def dtype(self) -> torch.dtype | None:
        """The autocast dtype (None: float32, no autocast)."""
        return None if self.compute == "float32" else DTYPES[self.compute]


@dataclass(frozen=True)
class CpuChoice:
    """The choice for learning and for sampling, and where it came from (measured now, a cached file, or not
    measured)."""

    learning: Decision
    sampling: Decision
    source: str


def choose(rates: dict[str, float], tie: float = TIE) -> Decision:
    """The fastest path of ``rates`` ({path: GFLOP/s}, float32 among them), float32 unless another is more than
    ``tie`` times faster. The reason reads like ``bf16 77 GFLOP/s < float32 120: float32``."""
    if "float32" not in rates:
        raise ValueError(f"rates {rates} lack float32, the baseline every choice is measured against")
    base = rates["float32"]
    others = {path: rate for path, rate in rates.items() if path != "float32"}
    if not others:
        return Decision("float32", f"float32 {base:.0f} GFLOP/s, the only path here: float32", dict(rates))
    best = max(others, key=others.get)
    if others[best] > tie * base:
        winner = best
    elif others[best] >= base:
        return Decision(
            "float32",
            f"{best} {others[best]:.0f} GFLOP/s is within {tie - 1:.0%} of float32 {base:.0f}: float32 (a tie keeps "
            "float32's precision)",
            dict(rates),
        )
    else:
        winner = "float32"
    losers = ", ".join(f"{p} {r:.0f}" for p, r in sorted(rates.items(), key=lambda kv: -kv[1]) if p != winner)
    return Decision(winner, f"{losers} GFLOP/s < {winner} {rates[winner]:.0f}: {winner}", dict(rates))


def cache_key(shapes: list[Shape], caps: CpuCaps, learn_rows: int, sample_rows: int) -> dict:
    """What the rates depend on: the CPU (model, cores, forced flags), torch, the paths, rows and shapes."""
    learning, sampling = candidates(caps)
    return {
        "probe": PROBE_VERSION,
        "cpu": caps.model,
        "machine": caps.machine,
        "cores": os.cpu_count(),
        "torch": torch.__version__,
        "forced": caps.forced,
        **{env: os.environ[env] for env in ISA_ENVS if os.environ.get(env)},  # absent when unset: older keys hold
        "learning": learning,
        "sampling": sampling,
        "learn_rows": learn_rows,
        "sample_rows": sample_rows,
        "shapes": [[s.in_features, s.out_features, s.count] for s in shapes],
    }


def cache_path(key: dict, root: str | Path | None = None) -> Path:
    return keyed_file(Path(root or default_cache_root()) / CACHE_FOLDER, key)


def read_cached(path: Path, key: dict) -> dict | None:
    """The cached entry at ``path`` for ``key`` (``rates``, and the ``load`` average it was measured at), or None: no
    file, or one that does not hold them (named in one line on stderr; the caller measures again and replaces it)."""

    def check(entry: dict) -> None:
        rates = entry["rates"]
        for phase in ("learning", "sampling"):
            if set(rates[phase]) != set(key[phase]) or not all(
                isinstance(v, (int, float)) and v > 0 for v in rates[phase].values()
            ):
                raise ValueError(f"its {phase} rates are not positive numbers for {key[phase]}")

    return read_keyed(path, key, check, "a CPU probe result")


def clear_cache(root: str | Path | None = None) -> int:
    """Delete every cached probe result (``grpokit env --probe``); how many there were."""
    folder = Path(root or default_cache_root()) / CACHE_FOLDER
    files = list(folder.glob("*.json")) if folder.is_dir() else []
    for file in files:
        file.unlink(missing_ok=True)
    return len(files)


def forced_choice() -> CpuChoice | None:
    """The choice ``GRPOKIT_CPU_PRECISION`` forces (module docstring), or None when it is unset. ``bf16`` (or
    ``float32``) sets learning and sampling; ``LEARNING/SAMPLING`` each (learning: float32 | bf16, no fp16 learning
    on a CPU: no loss scale; sampling: float32 | bf16 | fp16). Raises ConfigError on another value."""
    value = os.environ.get(FORCE_ENV, "").strip().lower()
    if not value:
        return None
    learning, _, sampling = value.partition("/")
    sampling = sampling or learning
    if learning not in ("float32", "bf16") or sampling not in ("float32", "bf16", "fp16"):
        raise ConfigError(
            f"{FORCE_ENV}={value!r} is not a compute choice: use float32, bf16, or LEARNING/SAMPLING such as "
            f"float32/bf16 (learning float32 or bf16, sampling float32, bf16 or fp16), or unset it to measure"
        )
    why = f"forced by {FORCE_ENV}={value}, not measured"
    return CpuChoice(Decision(learning, why), Decision(sampling, why), f"not measured ({FORCE_ENV} is set)")


def cpu_choice(
    shapes: list[Shape],
    *,
    caps: CpuCaps | None = None,
    learn_rows: int = LEARN_ROWS,
    sample_rows: int = 32,
    probe: bool = False,
    measure_fn=None,
    root: str | Path | None = None,
) -> CpuChoice:
    """The compute choice for a model of these matmul ``shapes`` on this CPU (module docstring): from the cache,
    else measured (``measure_fn(shapes, caps, learn_rows, sample_rows)`` -> {"learning"|"sampling": {path: GFLOP/s}},
    default :func:`grpokit.kernels.cpu_probe.measure`) and cached; ``probe``: measure even when cached."""
    forced = forced_choice()
    if forced is not None:
        return forced
    caps = caps or cpu_caps()
    learning, sampling = candidates(caps)
    if len(learning) == 1 and len(sampling) == 1:
        why = "float32: the only path here (no oneDNN bf16 kernels on this CPU), not measured"
        return CpuChoice(Decision("float32", why), Decision("float32", why), "not measured")
    if not shapes:
        why = "float32: the model has no Linear layers to time"
        return CpuChoice(Decision("float32", why), Decision("float32", why), "not measured")
    key = cache_key(shapes, caps, learn_rows, sample_rows)
    path = cache_path(key, root)
    cached = None if probe else read_cached(path, key)
    if cached is not None:
        rates = cached["rates"]
        return CpuChoice(
            choose(rates["learning"]), choose(rates["sampling"]), f"{_at(cached.get('load'))}, cached in {path}"
        )
    load = _load()
    try:
        rates = (measure_fn or measure)(shapes, caps, learn_rows, sample_rows)
        learn, sample = choose(rates["learning"]), choose(rates["sampling"])
    except Exception as exc:  # a path torch cannot run here, or no usable rates: the flags decide, saying why
        return _by_flags(caps, exc)
    if load is not None and load > (os.cpu_count() or 1):  # others' work skewed the timings: not kept
        why = "busier than its cores: measured again next time; `grpokit env --probe` on a quieter machine keeps it"
        return CpuChoice(learn, sample, f"{_at(load, now=True)}, not saved ({why})")
    source = f"{_at(load, now=True)}, saved in {path}"
    try:
        write_atomic(path, json.dumps({"key": key, "rates": rates, "load": load}, indent=1))
    except OSError as exc:
        source = f"measured now, not saved ({type(exc).__name__}: {exc})"
    return CpuChoice(learn, sample, source)


def _at(load, now: bool = False) -> str:
    """How busy the machine was when measured (others' work slows the timings): ``measured [now] at a load average
    of 1.2 on 2 cores``."""
    busy = f" at a load average of {load:.1f} on {os.cpu_count()} cores" if isinstance(load, (int, float)) else ""
    return f"measured{' now' if now else ''}{busy}"


def _load() -> float | None:
    """The 1-minute load average (other work slows the probe's timings), or None where the OS has none."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def _by_flags(caps: CpuCaps, exc: BaseException) -> CpuChoice:
    compute = "bf16" if caps.native_bf16 else "float32"
    flags = "native bf16 matmul" if caps.native_bf16 else "no native bf16 matmul"
    error = f"{type(exc).__name__}: {exc}".splitlines()[0][:200]
    why = f"the probe failed ({error}); by the CPU's flags ({flags}): {compute}"
    return CpuChoice(Decision(compute, why), Decision(compute, why), "not measured")


def choice_lines(choice: CpuChoice) -> list[str]:
    """``learning: ...`` and ``sampling: ...`` lines, then where the rates came from."""
    return [
        f"learning: {choice.learning.compute} ({choice.learning.reason})",
        f"sampling: {choice.sampling.compute} ({choice.sampling.reason})",
        f"rates (GFLOP/s per core): {choice.source}",
    ]


def env_lines(probe: bool = False) -> tuple[dict[str, str], CpuChoice]:
    """``grpokit env``'s lines and the choice they show, on a Qwen2.5-0.5B-shaped model's matmuls (``probe``: clear
    the cache and measure again)."""
    cleared = clear_cache() if probe else 0
    choice = cpu_choice(reference_shapes(), probe=probe)
    lines = {
        "mixed_precision auto, learning": f"{choice.learning.compute} ({choice.learning.reason})",
        "mixed_precision auto, sampling": f"{choice.sampling.compute} ({choice.sampling.reason})",
        "precision probe": f"on a Qwen2.5-0.5B-shaped model's matmuls, {choice.source}"
        + (f"; cleared {cleared} cached result(s)" if probe else "; `grpokit env --probe` measures again"),
    }
    return lines, choice


@dataclass(frozen=True)
class RunCompute:
    """A run's autocast dtypes (None: the weights' dtype) for learning and for sampling, and lines saying how they
    were chosen (written at the top of the run's config.yaml, printed by ``grpokit explain``)."""

    learning: torch.dtype | None
    sampling: torch.dtype | None
    notes: tuple[str, ...] = ()


def run_compute(
    dtype: str,
    device: torch.device,
    model: torch.nn.Module,
    mixed_precision: str = "auto",
    *,
    sample_rows: int = 32,
    world_size: int = 1,
    own_sampler: bool = True,
    **choice_kwargs,
) -> RunCompute:
    """The run's compute dtypes (module docstring). ``own_sampler``: grpokit's sampler samples (vLLM and
    transformers' generate sample in the learning dtype); ``choice_kwargs`` go to :func:`cpu_choice`."""
    from grpokit.machine.hardware import autocast_dtype
    from grpokit.machine.precision import MIN_AUTOCAST_PARAMS

    weights = "float32" if dtype == "auto" else dtype
    forced = forced_choice() if device.type == "cpu" and dtype == mixed_precision == "auto" else None
    if forced is not None:  # at any size and process count (forced_choice)
        sampling = forced.sampling if own_sampler else forced.learning
        lines = choice_lines(CpuChoice(forced.learning, sampling, forced.source))
        return RunCompute(
            forced.learning.dtype,
            sampling.dtype,
            ("compute: mixed_precision auto on this CPU, forced", *(f"  {line}" for line in lines)),
        )
    if device.type != "cpu" or dtype != "auto" or mixed_precision != "auto" or world_size > 1:
        compute = autocast_dtype(dtype, device, model, mixed_precision)
        name = _NAMES.get(compute, weights)
        why = (
            f"{world_size} processes: one rule for every rank, by the CPU's flags"
            if device.type == "cpu" and world_size > 1 and dtype == mixed_precision == "auto"
            else f"dtype {dtype}, mixed_precision {mixed_precision} on {device.type}"
        )
        return RunCompute(compute, compute, (f"compute: {name} for learning and sampling ({why})",))
    params = sum(p.numel() for p in model.parameters())
    if params < MIN_AUTOCAST_PARAMS:
        why = f"a model of {params / 1e6:.2f}M parameters < {MIN_AUTOCAST_PARAMS // 10**6}M, not measured"
        return RunCompute(None, None, (f"compute: float32 for learning and sampling ({why})",))
    choice = cpu_choice(matmul_shapes(model), sample_rows=sample_rows, **choice_kwargs)
    sampling = (
        choice.sampling
        if own_sampler
        else Decision(choice.learning.compute, "as learning: generation.engine is not grpokit's sampler")
    )
    caps = cpu_caps()
    head = (
        f"compute: mixed_precision auto on this CPU ({caps.model or caps.machine}, {os.cpu_count()} cores), "
        "measured on the model's matmul shapes"
    )
    lines = choice_lines(CpuChoice(choice.learning, sampling, choice.source))
    return RunCompute(choice.learning.dtype, sampling.dtype, (head, *(f"  {line}" for line in lines)))
