"""Rollout sources: where a step's rollouts come from, one small class per mode, behind one interface.

A *sampler* turns a step's global batch of prompt indices into this rank's share of its rollouts:

- :class:`EngineSampler`: the run's engine (hf or vllm) in this process, one random stream;
- :class:`GroupSeededSampler`: the same, each group sampled from its own seed (``seed_per_group``, torchrun), so the
  rollouts do not depend on how the prompts are split (:mod:`grpokit.rollout.seeding`);
- :class:`ToolSampler`: multi-turn tool rollouts from the dataset rows (:mod:`grpokit.train.sampling.tool_rollouts`);
- :class:`RawPromptSampler`: an engine that takes the prompts as the dataset holds them (``takes_raw_prompts``: TRL's
  rollout_func, :mod:`grpokit.rollout.rollout_func`);
- :class:`RaySampler`: Ray rollout workers (rank 0 publishes the weights, submits, collects and scatters).

A *source* decides when a batch is sampled: :class:`SyncRollouts` in the step (and further rounds within it, for
dynamic sampling), :class:`OneStepOffRollouts` one step ahead on the Ray workers (async). The composition root
picks one of each from :data:`SAMPLERS` and :data:`SOURCES`; the rollout scheduler only dispatches to them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from grpokit.rollout.seeding import generate_per_group, group_seed, split_rollouts
from grpokit.rollout.types import Rollouts, SamplingParams

Draw = Callable[[], list[int]]  # the next global batch of prompt indices


class Sampler(Protocol):
    """Samples this rank's share of a step's global batch of prompts (``first_group``: the batch's first group's
    index in the step, for the seeds per group)."""

    def sample(self, step: int, batch: list[int], first_group: int) -> Rollouts: ...

    def metrics(self) -> dict[str, float]: ...

    def close(self) -> None: ...


class EngineSampler:
    """This rank's groups sampled by the run's ``engine`` in one call, from its random stream. ``prompts``: the
    training PromptSource; ``model``: the policy (FSDP gathers it whole for sampling)."""

    def __init__(
        self, *, engine, prompts, procs, model, num_generations: int, params: SamplingParams, seed: int
    ) -> None:
        self.engine, self.prompts, self.procs, self.model = engine, prompts, procs, model
        self.num_generations, self.params, self.seed = num_generations, params, seed

    def sample(self, step: int, batch: list[int], first_group: int) -> Rollouts:
        indices, first = self.procs.shard(batch)
        with self.procs.unsharded(self.model):  # FSDP: whole weights for sampling, gathered once
            return self._generate(step, indices, first + first_group)

    def _generate(self, step: int, indices: list[int], first: int) -> Rollouts:
        return self.engine.generate([self.prompts.ids[i] for i in indices], self.num_generations, self.params)

    def seeds(self, step: int, count: int, first: int) -> list[int]:
        """Seeds of ``count`` groups starting at group ``first`` of the step's global batch."""
        return [group_seed(self.seed, step, first + j) for j in range(count)]

    def metrics(self) -> dict[str, float]:
        return {}

    def close(self) -> None:
        pass


class GroupSeededSampler(EngineSampler):
    """Each group sampled from its own seed (seed, step, group), whatever the split over processes."""

    def _generate(self, step: int, indices: list[int], first: int) -> Rollouts:
        ids = [self.prompts.ids[i] for i in indices]
        return generate_per_group(
            self.engine, ids, self.seeds(step, len(indices), first), self.num_generations, self.params
        )


class ToolSampler(EngineSampler):
    """Multi-turn tool rollouts of the prompts' dataset rows (``tools``: the run's ToolRollouts), groups seeded on
    their own and decoded in one batch; its metrics are the last batch's tool calls."""

    def __init__(self, *, tools, **parts: Any) -> None:
        super().__init__(**parts)
        self.tools = tools
        self._metrics: dict[str, float] = {}

    def _generate(self, step: int, indices: list[int], first: int) -> Rollouts:
        from grpokit.train.sampling.tool_rollouts import conversation_metrics

        rows = [self.prompts.rows[i] for i in indices]
        rollouts = self.tools.generate(rows, self.num_generations, self.params, self.seeds(step, len(indices), first))
        self._metrics = conversation_metrics(rollouts.conversations)
        return rollouts

    def metrics(self) -> dict[str, float]:
        return self._metrics

    def close(self) -> None:
        self.tools.close()


class RawPromptSampler(EngineSampler):
    """This rank's groups sampled by an engine that takes the raw prompts (``takes_raw_prompts``): each row's
    ``prompt_column`` as the dataset holds it (a string or chat messages), as TRL hands them to a rollout_func."""

    def __init__(self, *, prompt_column: str, **parts: Any) -> None:
        super().__init__(**parts)
        self.prompt_column = prompt_column

    def _generate(self, step: int, indices: list[int], first: int) -> Rollouts:
        prompts = [self.prompts.rows[i][self.prompt_column] for i in indices]
        return self.engine.generate(prompts, self.num_generations, self.params)


class RaySampler(EngineSampler):
    """Ray rollout workers sample the whole global batch (``remote``: rank 0's RayRolloutEngine, None on the other
    ranks), groups seeded on their own; rank 0 scatters each rank's share. Before sampling, the current weights
    (``engine.policy_version``) are published to the workers unless they have them."""

    def __init__(self, *, remote, **parts: Any) -> None:
        super().__init__(**parts)
        self.remote = remote
        self._published: int | None = None  # weights version last sent to the Ray workers

    def sample(self, step: int, batch: list[int], first_group: int) -> Rollouts:
        pending = self.submit(step, batch, first_group)
        return self.scatter(None if pending is None else self.remote.collect(pending))

    def submit(self, step: int, batch: list[int], first_group: int = 0):
        """Start sampling the whole global ``batch`` (first group: ``first_group`` of the step) on the Ray workers;
        rank 0 drives them and gets the pending handle, other ranks get None (their share arrives through
        :meth:`scatter`)."""
        self._publish()
        if self.remote is None:
            return None
        seeds = self.seeds(step, len(batch), first_group)
        return self.remote.submit([self.prompts.ids[i] for i in batch], seeds, self.num_generations, self.params)

    def collect(self, pending) -> Rollouts:
        return self.remote.collect(pending)

    def scatter(self, rollouts: Rollouts | None) -> Rollouts:
        """Rank 0's rollouts of the global batch -> this rank's contiguous share (the groups ``shard`` gives it)."""
        procs = self.procs
        return procs.scatter_objects(split_rollouts(rollouts, procs.world_size) if procs.is_main else None)

    def _publish(self) -> None:
        """Send the current weights to the Ray workers unless they already have this version. Rank 0
        publishes: with DDP it holds the whole policy; FSDP gathers it there from every rank."""
        from grpokit.distributed.torch_dist import trainable_state
        from grpokit.processes import is_sharded

        version = self.engine.policy_version
        if self._published == version or not (self.procs.is_main or is_sharded(self.model)):
            return
        state = trainable_state(self.model)
        if self.remote is not None:
            self.remote.publish(state, version)
        self._published = version

    def metrics(self) -> dict[str, float]:
        return {} if self.remote is None else {"rollout_worker_restarts": float(self.remote.restarts)}

    def close(self) -> None:
        if self.remote is not None:
            self.remote.shutdown()


class RolloutSource(Protocol):
    """When a step's batch is sampled. ``off_policy``: its rollouts may come from an older policy than the one
    trained (the learner then takes the ratio against their sampling log-probs)."""

    off_policy: bool

    def next(self, step: int, draw: Draw) -> tuple[list[int], Rollouts]:
        """The step's global batch of prompt indices (``draw`` gives a new one) and this rank's rollouts of it."""
        ...

    def more(self, step: int, batch: list[int], first_group: int) -> Rollouts:
        """A further round's rollouts within the step (dynamic sampling)."""
        ...

    def state_dict(self) -> tuple[list[int] | None, dict | None]:
        """(prompt indices drawn and not yet trained on, their rollouts already sampled) for a checkpoint."""
        ...

    def load_state_dict(self, indices: list[int] | None, rollouts: dict | None) -> bool:
        """Restore a checkpoint's pending batch; True when its rollouts were taken (else the scheduler samples the
        indices again)."""
        ...

    def metrics(self) -> dict[str, float]: ...

    def close(self) -> None: ...


class SyncRollouts:
    """Each step's batch is drawn and sampled in the step (the default)."""

    off_policy = False

    def __init__(self, sampler: Sampler) -> None:
        self.sampler = sampler

    def next(self, step: int, draw: Draw) -> tuple[list[int], Rollouts]:
        batch = draw()
        return batch, self.sampler.sample(step, batch, 0)

    def more(self, step: int, batch: list[int], first_group: int) -> Rollouts:
        return self.sampler.sample(step, batch, first_group)

    def state_dict(self) -> tuple[list[int] | None, dict | None]:
        return None, None

    def load_state_dict(self, indices: list[int] | None, rollouts: dict | None) -> bool:
        return False

    def metrics(self) -> dict[str, float]:
        return self.sampler.metrics()

    def close(self) -> None:
        self.sampler.close()


class OneStepOffRollouts(SyncRollouts):
    """``async_rollouts`` (Ray): the next step's batch is drawn and submitted to the workers before this step
    trains, so sampling overlaps the update (one step off-policy), up to ``last_step``. The pending batch is part
    of a checkpoint (its prompt indices, and its rollouts collected), so a resume trains on the same data."""

    off_policy = True

    def __init__(self, sampler: RaySampler, *, last_step: int) -> None:
        super().__init__(sampler)
        self.last_step = last_step
        # (global batch of prompt indices, the next step's rollouts: rank 0's PendingRollouts in flight or
        # collected Rollouts; None on other ranks until scattered)
        self._pending: tuple[list[int], Any] | None = None

    def next(self, step: int, draw: Draw) -> tuple[list[int], Rollouts]:
        if self._pending is not None:
            batch, pending = self._pending
            self._pending = None
            if pending is not None and not isinstance(pending, Rollouts):  # rank 0, still in flight
                pending = self.sampler.collect(pending)
            rollouts = self.sampler.scatter(pending)
        else:
            batch, rollouts = super().next(step, draw)
        if step < self.last_step:
            upcoming = draw()
            self._pending = (upcoming, self.sampler.submit(step + 1, upcoming))
        return batch, rollouts

    def more(self, step: int, batch: list[int], first_group: int) -> Rollouts:
        raise RuntimeError("one-step-off rollouts sample ahead; dynamic sampling's rounds need synchronous ones.")

    def state_dict(self) -> tuple[list[int] | None, dict | None]:
        """Rank 0 collects pending rollouts still in flight: a resume trains on the same data."""
        pending = None
        if self._pending is not None and self.sampler.procs.is_main:
            indices, rollouts = self._pending
            if not isinstance(rollouts, Rollouts):
                rollouts = self.sampler.collect(rollouts)
                self._pending = (indices, rollouts)
            pending = dataclasses.asdict(rollouts)
        return (self._pending[0] if self._pending else None), pending

    def load_state_dict(self, indices: list[int] | None, rollouts: dict | None) -> bool:
        if rollouts is None:
            return False
        self._pending = (indices, Rollouts.from_dict(rollouts))  # the step after the checkpoint, sampled before it
        return True


@dataclass(frozen=True)
class Situation:
    """What decides a run's sampler: Ray rollout workers (``ray``), tool rollouts (``tools``), an engine that takes
    the raw prompts (``raw_prompts``: a rollout_func), rollouts that must not depend on the split over processes
    (``seeded``: seed_per_group, or several processes)."""

    ray: bool = False
    tools: bool = False
    raw_prompts: bool = False
    seeded: bool = False


@dataclass(frozen=True)
class SamplerEntry:
    """A sampler kind: ``cls`` is built with the common parts (engine, prompts, procs, model, num_generations,
    params, seed) and the extras it ``needs`` (``remote``: the Ray workers; ``tools``: the ToolRollouts;
    ``prompt_column``), which the composition root supplies by name; ``applies(situation)``: whether it samples a
    run in that :class:`Situation`."""

    cls: type
    applies: Callable[[Situation], bool]
    needs: tuple[str, ...] = ()


# The samplers by name, in order of precedence: the first that applies samples the run (the composition root,
# grpokit/build/rollouts.py, asks :func:`pick_sampler`). Adding one is a class and one line here.
SAMPLERS: dict[str, SamplerEntry] = {
    "ray": SamplerEntry(RaySampler, lambda s: s.ray, needs=("remote",)),
    "tools": SamplerEntry(ToolSampler, lambda s: s.tools, needs=("tools",)),  # groups seeded, decoded in one batch
    "raw_prompts": SamplerEntry(RawPromptSampler, lambda s: s.raw_prompts, needs=("prompt_column",)),
    "group_seeded": SamplerEntry(GroupSeededSampler, lambda s: s.seeded),
    "engine": SamplerEntry(EngineSampler, lambda s: True),
}


def pick_sampler(situation: Situation) -> SamplerEntry:
    """The first sampler of :data:`SAMPLERS` that applies to ``situation``."""
    return next(entry for entry in SAMPLERS.values() if entry.applies(situation))


# The sources by name: one step off with async_rollouts, else synchronous.
SOURCES: dict[str, type] = {"sync": SyncRollouts, "one_step_off": OneStepOffRollouts}
