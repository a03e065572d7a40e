"""Samplers: what turns a step's global batch of prompt indices into this rank's share of its rollouts.

- :class:`EngineSampler`: the run's engine (hf or vllm) in this process, one random stream;
- :class:`GroupSeededSampler`: the same, each group sampled from its own seed (``seed_per_group``, torchrun), so the
  rollouts do not depend on how the prompts are split (:mod:`grpokit.rollout.seeding`);
- :class:`ToolSampler`: multi-turn tool rollouts from the dataset rows (:mod:`grpokit.train.experience.tool_rollouts`);
- :class:`RawPromptSampler`: an engine that takes the prompts as the dataset holds them (``takes_raw_prompts``: TRL's
  rollout_func, :mod:`grpokit.rollout.rollout_func`);
- :class:`RaySampler`: Ray rollout workers (rank 0 publishes the weights, submits, collects and scatters).

- :class:`ThreadSampler`: a copy of the policy sampling on the producer's thread (bounded staleness without Ray).
- :class:`~grpokit.train.experience.server_ahead.ServerAheadSampler`: a vLLM server driven from the producer's thread
  (bounded staleness with ``vllm_mode: server``).

Each is built by its ``from_inputs(SamplerInputs)``; which one samples a run is picked by
:data:`grpokit.train.experience.sources.SAMPLERS` from the situations each entry serves.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from grpokit.rollout.seeding import generate_per_group, group_seed, split_rollouts
from grpokit.rollout.types import Rollouts, SamplingParams

if TYPE_CHECKING:
    from grpokit.train.experience.sampler_entry import SamplerInputs


class Sampler(Protocol):
    """Samples this rank's share of a step's global batch of prompts (``first_group``: the batch's first group's
    index in the step, for the seeds per group)."""

    def sample(self, step: int, batch: list[int], first_group: int) -> Rollouts: ...

    def metrics(self) -> dict[str, float]: ...

    def close(self) -> None: ...


class EngineSampler:
    """This rank's groups sampled by the run's ``engine`` in one call, from its random stream. ``prompts``: the
    training PromptSource; ``model``: the policy (FSDP: sampled sharded, ranks in lockstep)."""

    @classmethod
    def from_inputs(cls, inputs: SamplerInputs) -> EngineSampler:
        """The sampler built from the run's :class:`SamplerInputs` (here: the common parts)."""
        return cls(**inputs.common())

    def __init__(
        self, *, engine, prompts, procs, model, num_generations: int, params: SamplingParams, seed: int
    ) -> None:
        self.engine, self.prompts, self.procs, self.model = engine, prompts, procs, model
        self.num_generations, self.params, self.seed = num_generations, params, seed

    def sample(self, step: int, batch: list[int], first_group: int) -> Rollouts:
        indices, first = self.procs.shard(batch)
        with self.procs.lockstep(self.model):  # FSDP: every rank makes the same forward calls (padding if done)
            return self._generate(step, indices, first + first_group)

    def _generate(self, step: int, indices: list[int], first: int) -> Rollouts:
        return self.engine.generate([self.prompts.ids[i] for i in indices], self.num_generations, self.params)

    def seeds(self, step: int, count: int, first: int) -> list[int]:
        """Seeds of ``count`` groups starting at group ``first`` of the step's global batch."""
        return [group_seed(self.seed, step, first + j) for j in range(count)]

    def metrics(self) -> dict[str, float]:
        return {}

    def share_weights(self) -> None:
        """Samplers ahead whose batches wait for newer weights publish them here (Ray's); others need not."""

    def interrupt(self) -> None:
        """The run is ending: stop any wait in the background (Ray's partial rollouts)."""

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

    @classmethod
    def from_inputs(cls, inputs: SamplerInputs) -> ToolSampler:
        return cls(tools=inputs.tool_rollouts, **inputs.common())

    def __init__(self, *, tools, **parts: Any) -> None:
        super().__init__(**parts)
        self.tools = tools
        self._metrics: dict[str, float] = {}

    def _generate(self, step: int, indices: list[int], first: int) -> Rollouts:
        from grpokit.train.experience.tool_rollouts import conversation_metrics

        rows = [self.prompts.rows[i] for i in indices]
        images = [getattr(self.prompts.ids[i], "images", None) for i in indices]  # a VisionPrompt's (PIL)
        seeds = self.seeds(step, len(indices), first)
        rollouts = self.tools.generate(rows, self.num_generations, self.params, seeds, images=images)
        self._metrics = conversation_metrics(rollouts.conversations)
        return rollouts

    def metrics(self) -> dict[str, float]:
        return self._metrics

    def close(self) -> None:
        self.tools.close()


class RawPromptSampler(EngineSampler):
    """This rank's groups sampled by an engine that takes the raw prompts (``takes_raw_prompts``): each row's
    ``prompt_column`` as the dataset holds it (a string or chat messages), as TRL hands them to a rollout_func."""

    @classmethod
    def from_inputs(cls, inputs: SamplerInputs) -> RawPromptSampler:
        return cls(prompt_column=inputs.prompt_column, **inputs.common())

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

    @classmethod
    def from_inputs(cls, inputs: SamplerInputs) -> RaySampler:
        return cls(remote=inputs.remote(), partial=inputs.workers_continue_partial, **inputs.common())

    def __init__(self, *, remote, partial: bool = False, **parts: Any) -> None:
        """``partial``: the workers continue partial rollouts on newer weights (:mod:`grpokit.rollout.partial`),
        which :meth:`share_weights` then publishes."""
        super().__init__(**parts)
        self.remote, self.partial = remote, partial
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
        ids = [self.prompts.ids[i] for i in batch]
        return self.remote.submit(ids, seeds, self.num_generations, self.params, step=step)

    def share_weights(self) -> None:
        """Publish the current weights now (partial rollouts continue on them: before a step takes its batch, and
        before a checkpoint or an evaluation waits for the batches admitted)."""
        if self.partial:
            self._publish()

    def interrupt(self) -> None:
        """The run is ending: stop waiting for weights that may never be published."""
        if self.remote is not None:
            self.remote.interrupt()

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
        from grpokit.system.processes import is_sharded

        version = self.engine.policy_version
        if self._published == version or not (self.procs.is_main or is_sharded(self.model)):
            return
        state = trainable_state(self.model)
        if self.remote is not None:
            self.remote.publish(state, version)
        self._published = version

    def metrics(self) -> dict[str, float]:
        if self.remote is None:
            return {}
        found = {"rollout_worker_restarts": float(self.remote.restarts)}
        if getattr(self.remote, "sync_gap_max", None) is not None:  # vLLM workers: against their copy, same version
            found["rollout_worker_sync_gap_max"] = self.remote.sync_gap_max
        if getattr(self.remote, "sync_gap_continued_max", None) is not None:  # partial rollouts' continuations
            found["rollout_worker_sync_gap_continued_max"] = self.remote.sync_gap_continued_max
        return found

    def close(self) -> None:
        if self.remote is not None:
            self.remote.shutdown()


class ThreadSampler(EngineSampler):
    """Samples ahead in this process (``max_staleness`` >= 1 without Ray; the hf engine, one process): ``submit``
    takes a copy of the policy's weights now (their version: ``engine.policy_version``); ``collect``, on the
    producer's thread, loads them into the sampler's own copy of the model (``own_engine``, built on
    ``copy.deepcopy(model)``) and samples the whole batch in one call, its random stream seeded from (seed, step):
    the rollouts are a function of (seed, step, weights), whenever the thread runs. The learner's weights are never
    read while it trains. Memory: one more model, and up to K + 1 weight copies in the queue."""

    @classmethod
    def from_inputs(cls, inputs: SamplerInputs) -> ThreadSampler:
        return cls(own_engine=inputs.own_engine(), **inputs.common())

    def __init__(self, *, own_engine, **parts: Any) -> None:
        super().__init__(**parts)
        self.own_engine = own_engine

    def sample(self, step: int, batch: list[int], first_group: int) -> Rollouts:
        return self.collect(self.submit(step, batch, first_group))

    def submit(self, step: int, batch: list[int], first_group: int = 0):
        weights = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
        return step, list(batch), first_group, weights, self.engine.policy_version

    def collect(self, pending) -> Rollouts:
        step, batch, first_group, weights, version = pending
        self.own_engine.model.load_state_dict(weights)
        self.own_engine.policy_version = version
        self.own_engine.generator.manual_seed(self.seeds(step, 1, first_group)[0])  # one process: one stream a batch
        return self.own_engine.generate([self.prompts.ids[i] for i in batch], self.num_generations, self.params)

    def scatter(self, rollouts: Rollouts | None) -> Rollouts:
        return rollouts
