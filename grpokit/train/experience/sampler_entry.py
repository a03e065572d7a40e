"""What picks a run's sampler, as data: the run's :class:`Situation`, each sampler's :class:`SamplerEntry` (the
situations it serves), and :class:`SamplerInputs`, the one typed object every sampler is built from
(``from_inputs``, a classmethod of each sampler class, takes the parts it needs from it)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from grpokit.rollout.types import SamplingParams


@dataclass(frozen=True)
class Situation:
    """What decides a run's sampler: Ray rollout workers (``ray``), tool rollouts (``tool_rollouts``), an engine that
    takes the raw prompts (``raw_prompts``: a rollout_func), rollouts that must not depend on the split over processes
    (``seeded``: seed_per_group, or several processes), sampling ahead in this process (``ahead``: max_staleness >= 1
    without Ray), a vLLM server as the engine (``server``)."""

    tool_rollouts: bool
    ray: bool = False
    raw_prompts: bool = False
    seeded: bool = False
    ahead: bool = False
    server: bool = False


@dataclass(frozen=True)
class SamplerEntry:
    """A sampler kind: ``cls`` (built by ``cls.from_inputs(SamplerInputs)``) and the situations it serves, one field
    per :class:`Situation` flag: True (the run must have it), False (must not), None (either). No two entries may
    serve one situation: :func:`pick_sampler` refuses the run, naming both."""

    cls: type
    ray: bool | None = None
    tool_rollouts: bool | None = None
    raw_prompts: bool | None = None
    seeded: bool | None = None
    ahead: bool | None = None
    server: bool | None = None

    def applies(self, situation: Situation) -> bool:
        """Whether every flag this entry sets is the run's."""
        return all(getattr(self, f.name) in (None, getattr(situation, f.name)) for f in dataclasses.fields(Situation))

    def serves(self) -> str:
        """The flags it sets, as ``ray=True, ahead=False``."""
        flags = (f"{f.name}={getattr(self, f.name)}" for f in dataclasses.fields(Situation))
        return ", ".join(flag for flag in flags if not flag.endswith("=None")) or "every run"


def pick_sampler(situation: Situation, entries: dict[str, SamplerEntry]) -> SamplerEntry:
    """The one entry of ``entries`` (by name) that serves ``situation``; a ValueError when none or two do."""
    names = [name for name, entry in entries.items() if entry.applies(situation)]
    if len(names) != 1:
        which = " and ".join(f"{n!r} ({entries[n].serves()})" for n in names) if names else "none"
        raise ValueError(
            f"samplers serving {situation}: {which}; exactly one must: set the flags of their SAMPLERS registrations "
            "so that they exclude each other."
        )
    return entries[names[0]]


@dataclass(frozen=True)
class SamplerInputs:
    """What a sampler is built from: the common parts (``engine``, ``prompts``, ``procs``, ``model``,
    ``num_generations``, ``params``, ``seed``; :meth:`common`), the facts only some take (``prompt_column``;
    ``tool_rollouts``: the run's ToolRollouts or None; ``partial_rollouts``: a vLLM server's (S tokens, timeout) or
    None; ``workers_continue_partial``: Ray workers continue partial rollouts), and three parts built only when
    a sampler asks (a Ray start on rank 0, copies of the policy): ``remote()``, ``own_engine()``, ``own_model()``."""

    engine: Any
    prompts: Any
    procs: Any
    model: Any
    num_generations: int
    params: SamplingParams
    seed: int
    prompt_column: str
    tool_rollouts: Any = None
    partial_rollouts: tuple[int, float] | None = None
    workers_continue_partial: bool = False
    remote: Callable[[], Any] = lambda: None
    own_engine: Callable[[], Any] = lambda: None
    own_model: Callable[[], Any] = lambda: None

    def common(self) -> dict[str, Any]:
        """The keyword arguments every sampler's constructor takes."""
        names = ("engine", "prompts", "procs", "model", "num_generations", "params", "seed")
        return {name: getattr(self, name) for name in names}
