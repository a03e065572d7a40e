"""``generation.engine: auto``: which registered engine samples, resolved by the composition root before it builds one.

The candidates are the engines whose :class:`~grpokit.rollout.engines.EngineEntry` names a ``package``
(``vllm``): auto may pick one where that package is installed and the run's settings allow it (the root's
``refusal``: the config validated with that engine, its ``check_environment``, images ...). Otherwise grpokit's own
sampler, ``hf``.

- On CUDA: the first installed, allowed candidate, unmeasured (vLLM is the faster sampler there).
- On a CPU, one process: a short measurement, both engines on the run's model (``measure_fn(names)`` ->
  {name: completion tokens per second}: a few rows, a few tokens, the same threads); a candidate is taken when it is
  more than :data:`TIE` times hf's rate. The rates are cached like the precision probe's
  (:mod:`grpokit.kernels.cpu_precision`): ``<cache>/engine-choice/<hash>.json``, one file per CPU (model, cores, forced
  flags, oneDNN caps), torch and engine versions, model shape and dtypes, rows and tokens; written atomically; an
  unreadable file is named in one line and measured again; ``grpokit env --probe`` clears them.
- Several processes or another device: hf (per-rank timings could disagree).

``GRPOKIT_ENGINE_AUTO`` (:data:`FORCE_ENV`: a registered engine's name) replaces the choice, unmeasured: what the
tests use, and a user to rule the measurement out. Torch-free at import.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from grpokit.rollout.sampling_settings import AUTO_ENGINE

FORCE_ENV = "GRPOKIT_ENGINE_AUTO"
CACHE_FOLDER = "engine-choice"
CHOICE_VERSION = 1  # bump when what is timed changes
TIE = 1.05  # a candidate must be this many times faster than hf to be chosen
BASELINE = "hf"


@dataclass(frozen=True)
class EngineChoice:
    """The engine auto resolved to, why, where its rates came from, and the rates (tokens/s by engine; empty when
    nothing was measured)."""

    name: str
    reason: str
    source: str = "not measured"
    rates: dict = field(default_factory=dict)

    def note(self) -> str:
        return f"engine: auto -> {self.name} ({self.reason}; {self.source})"


def is_auto(name: str) -> bool:
    return name == AUTO_ENGINE


def candidates() -> dict[str, str]:
    """{engine: its package} for every engine auto may pick besides hf (``EngineEntry.package``)."""
    from grpokit.rollout.engines import ENGINES

    return {name: entry.package for name, entry in ENGINES.items() if entry.package and not entry.internal}


def installed(package: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(package) is not None


def package_version(package: str) -> str:
    """The installed version of the distribution that provides module ``package`` ("?" when unknown)."""
    from importlib import metadata

    for dist in metadata.packages_distributions().get(package, [package]):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return "?"


def choose(rates: dict[str, float], tie: float = TIE) -> tuple[str, str]:
    """(engine, why): the fastest of ``rates`` (hf among them) when it beats hf by more than ``tie``, else hf.
    E.g. {hf: 100, vllm: 117} -> vllm ("vllm 117 tokens/s > 1.05 x hf 100")."""
    if BASELINE not in rates:
        raise ValueError(f"rates {rates} lack {BASELINE}, the baseline auto measures against")
    base = rates[BASELINE]
    others = {name: rate for name, rate in rates.items() if name != BASELINE}
    best = max(others, key=others.get) if others else None
    if best is not None and others[best] > tie * base:
        return best, f"{best} {others[best]:.0f} tokens/s > {tie} x {BASELINE} {base:.0f}"
    vs = ", ".join(f"{n} {r:.0f}" for n, r in others.items())
    return BASELINE, f"{vs} tokens/s not > {tie} x {BASELINE} {base:.0f}"


def machine_key() -> dict:
    """What a CPU's rates depend on besides the model: the CPU, its cores, forced flags, oneDNN caps, torch."""
    import torch

    from grpokit.kernels.cpu_precision import ISA_ENVS
    from grpokit.machine.cpu_caps import cpu_caps

    caps = cpu_caps()
    return {
        "cpu": caps.model,
        "machine": caps.machine,
        "cores": os.cpu_count(),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "forced": caps.forced,
        **{env: os.environ[env] for env in ISA_ENVS if os.environ.get(env)},
    }


def forced() -> EngineChoice | None:
    """The engine ``GRPOKIT_ENGINE_AUTO`` forces, or None when unset; a ConfigError on a name not registered."""
    from grpokit.errors import ConfigError
    from grpokit.rollout.engines import ENGINES

    value = os.environ.get(FORCE_ENV, "").strip()
    if not value:
        return None
    names = [n for n, e in ENGINES.items() if not e.internal]
    if value not in names:
        raise ConfigError(f"{FORCE_ENV}={value!r} is not an engine: use one of {', '.join(names)}, or unset it.")
    return EngineChoice(value, f"forced by {FORCE_ENV}={value}")


def resolve(
    device_type: str,
    measure_fn: Callable[[list[str]], dict[str, float]],
    *,
    shape: dict,
    refusal: Callable[[str], str | None] = lambda name: None,
    world_size: int = 1,
    probe: bool = False,
    root: str | Path | None = None,
) -> EngineChoice:
    """The engine ``auto`` means for this run (module docstring). ``shape``: the model's and measurement's facts for
    the cache key (matmul shapes, dtypes, rows, tokens); ``refusal(name)``: why the run cannot use that engine, or
    None; ``probe``: measure even when cached."""
    chosen = forced()
    if chosen is not None:
        return chosen
    packages = candidates()
    present = {name: pkg for name, pkg in packages.items() if installed(pkg)}
    if not present:
        missing = ", ".join(f"{pkg} not installed" for pkg in packages.values()) or "no other engine"
        return EngineChoice(BASELINE, missing)
    refused = {name: refusal(name) for name in present}
    usable = [name for name, why in refused.items() if why is None]
    if not usable:
        return EngineChoice(BASELINE, "; ".join(f"not {name}: {why}" for name, why in refused.items()))
    if device_type == "cuda":
        return EngineChoice(usable[0], f"{present[usable[0]]} installed, on CUDA")
    if device_type != "cpu" or world_size > 1:
        return EngineChoice(BASELINE, f"{world_size} processes on {device_type}: only a one-process CPU run measures")
    key = {
        "version": CHOICE_VERSION,
        **machine_key(),
        "engines": {name: package_version(present[name]) for name in usable},
        **shape,
    }
    path = cache_path(key, root)
    cached = None if probe else read_cached(path, key)
    if cached is not None:
        name, why = choose(cached["rates"])
        return EngineChoice(name, why, f"measured, cached in {path}", cached["rates"])
    try:
        rates = {name: float(rate) for name, rate in measure_fn([BASELINE, *usable]).items()}
        name, why = choose(rates)
    except Exception as exc:  # an engine that cannot sample here: grpokit's own, saying why
        error = f"{type(exc).__name__}: {exc}".splitlines()[0][:200]
        return EngineChoice(BASELINE, f"the measurement failed ({error})")
    source = f"measured now, saved in {path}"
    try:
        from grpokit.system.cached_folders import write_atomic

        write_atomic(path, json.dumps({"key": key, "rates": rates}, indent=1))
    except OSError as exc:
        source = f"measured now, not saved ({type(exc).__name__}: {exc})"
    return EngineChoice(name, why, source, rates)


def cache_folder(root: str | Path | None = None) -> Path:
    from grpokit.system.cached_folders import default_cache_root

    return Path(root or default_cache_root()) / CACHE_FOLDER


def cache_path(key: dict, root: str | Path | None = None) -> Path:
    from grpokit.system.cached_folders import keyed_file

    return keyed_file(cache_folder(root), key)


def read_cached(path: Path, key: dict) -> dict | None:
    """The cached entry at ``path`` for ``key``, or None: no file, or one that does not hold positive rates for
    hf and the key's engines (named in one line on stderr; measured again and replaced)."""
    from grpokit.system.cached_folders import read_keyed

    def check(entry: dict) -> None:
        rates = entry["rates"]
        if set(rates) != {BASELINE, *key["engines"]} or not all(
            isinstance(v, (int, float)) and v > 0 for v in rates.values()
        ):
            raise ValueError("its rates are not positive numbers for hf and the engines measured")

    return read_keyed(path, key, check, "an engine measurement")
    try:
        entry = json.loads(path.read_text())
        rates = entry["rates"]
        if entry["key"] != key:
            raise ValueError("it was measured for another machine or model")
        if set(rates) != {BASELINE, *key["engines"]} or not all(
            isinstance(v, (int, float)) and v > 0 for v in rates.values()
        ):
            raise ValueError("its rates are not positive numbers for hf and the engines measured")
        return entry
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(f"grpokit: ignoring {path}, not an engine measurement ({exc}); measuring again", file=sys.stderr)
        return None


def clear_cache(root: str | Path | None = None) -> int:
    """Delete every cached engine measurement (``grpokit env --probe``); how many there were."""
    folder = cache_folder(root)
    files = list(folder.glob("*.json")) if folder.is_dir() else []
    for file in files:
        file.unlink(missing_ok=True)
    return len(files)


def env_line(device_type: str, root: str | Path | None = None) -> str:
    """``grpokit env``'s line: what auto picks on this machine and why."""
    chosen = forced()
    if chosen is not None:
        return f"{chosen.name} ({chosen.reason})"
    packages = candidates()
    present = [name for name, pkg in packages.items() if installed(pkg)]
    if not present:
        return f"hf ({', '.join(f'{pkg} not installed' for pkg in packages.values()) or 'no other engine'})"
    if device_type == "cuda":
        return f"{present[0]} ({packages[present[0]]} installed, on CUDA; unless the run's settings refuse it)"
    folder = cache_folder(root)
    picks = []
    for file in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            entry = json.loads(file.read_text())
            name, why = choose(entry["rates"])
            picks.append(f"{name} ({why}) for shapes {entry['key'].get('shapes')}")
        except (OSError, ValueError, KeyError, TypeError):
            continue
    installed_text = ", ".join(f"{packages[n]} {package_version(packages[n])}" for n in present)
    if not picks:
        return f"measured at a run's start on its model ({installed_text} installed; nothing cached yet in {folder})"
    return f"measured per model ({installed_text} installed); cached in {folder}: " + "; ".join(picks)
