"""Rollout sources: where a step's rollouts come from, one small class per mode, behind one interface.

A *sampler* turns a step's global batch of prompt indices into this rank's share of its rollouts:

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

A *source* decides when a batch is sampled: :class:`SyncRollouts` in the step (and further rounds within it, for
dynamic sampling), :class:`AheadRollouts` up to ``max_staleness`` K steps ahead (async; K = 1 is
``async_rollouts``' one-step-off), collected and scored on a background thread. The composition root picks one of
each from :data:`SAMPLERS` and :data:`SOURCES`; the rollout scheduler only dispatches to them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from grpokit.rollout.seeding import generate_per_group, group_seed, split_rollouts
from grpokit.rollout.types import Rollouts, SamplingParams
from grpokit.system.registry import Registry

Draw = Callable[[], list[int]]  # the next global batch of prompt indices


class Sampler(Protocol):
    """Samples this rank's share of a step's global batch of prompts (``first_group``: the batch's first group's
    index in the step, for the seeds per group)."""

    def sample(self, step: int, batch: list[int], first_group: int) -> Rollouts: ...

    def metrics(self) -> dict[str, float]: ...

    def close(self) -> None: ...


class EngineSampler:
    """This rank's groups sampled by the run's ``engine`` in one call, from its random stream. ``prompts``: the
    training PromptSource; ``model``: the policy (FSDP: sampled sharded, ranks in lockstep)."""

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

    def __init__(self, *, tools, **parts: Any) -> None:
        super().__init__(**parts)
        self.tools = tools
        self._metrics: dict[str, float] = {}

    def _generate(self, step: int, indices: list[int], first: int) -> Rollouts:
        from grpokit.train.experience.tool_rollouts import conversation_metrics

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

    def __init__(self, *, remote, partial: bool = False, **parts: Any) -> None:
        """``partial``: the workers continue partial rollouts on newer weights (:mod:`grpokit.distributed.ray_partial`),
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


class RolloutSource(Protocol):
    """When a step's batch is sampled. ``off_policy``: its rollouts may come from an older policy than the one
    trained (the learner then takes the ratio against their sampling log-probs)."""

    off_policy: bool

    def next(self, step: int, draw: Draw) -> tuple[list[int], Rollouts]:
        """The step's global batch of prompt indices (``draw`` gives a new one) and this rank's rollouts of it."""
        ...

    def next_scored(self, step: int, draw: Draw, score, reward_state, clock) -> Any:
        """The step's Trajectory: this rank's rollouts scored by ``score(step, indices, rollouts, trainer_state=...)``
        (``reward_state(step)``: the reward functions' trainer_state, taken when the batch is drawn); ``clock``'s
        laps ``generate`` and ``reward`` time what the step waited for."""
        ...

    def settle(self) -> None:
        """Wait for any work in the background (before an evaluation shares the tokenizer and the rewards)."""
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

    def next_scored(self, step: int, draw: Draw, score, reward_state, clock) -> Any:
        """The step's Trajectory: its batch drawn, sampled and scored (``score``, the trainer's) now."""
        batch, rollouts = self.next(step, draw)
        clock.lap("generate")
        indices, _ = self.sampler.procs.shard(batch)
        trajectory = score(step, indices, rollouts)
        clock.lap("reward")
        return trajectory

    def more(self, step: int, batch: list[int], first_group: int) -> Rollouts:
        return self.sampler.sample(step, batch, first_group)

    def settle(self) -> None:
        """Nothing runs in the background."""

    def state_dict(self) -> tuple[list[int] | None, dict | None]:
        return None, None

    def load_state_dict(self, indices: list[int] | None, rollouts: dict | None) -> bool:
        return False

    def metrics(self) -> dict[str, float]:
        return self.sampler.metrics()

    def close(self) -> None:
        self.sampler.close()


class AheadRollouts(SyncRollouts):
    """Bounded staleness (``max_staleness`` K >= 1; ``async_rollouts`` is K = 1): before step s trains, the batch of
    step s + K is drawn and admitted with the weights of now (version v(s), the one step s trains), so every batch
    is sampled by a policy at most K updates older than the one that trains on it; a producer never runs further
    ahead (admission, nothing is dropped). The first step admits steps 1..K+1 at once (all by version 0).

    A background :class:`~grpokit.train.experience.producer.Producer` thread finishes the admitted batches in order: it
    waits for their rollouts (``sampler.collect``: Ray workers, or :class:`ThreadSampler` sampling on its copy of the
    policy) and, in one process, ``scorers`` threads score them (``score_ahead``), up to that many batches at once:
    the learner does not wait on a reward. What a batch holds is fixed at admission (prompts, group seeds, the
    weights' version), never by the threads' timing.

    A checkpoint waits for the admitted batches and holds them all (their prompt indices, rollouts and the reward
    state they are scored with), so a resume trains on the same data; ``last_step``: nothing is admitted past it."""

    off_policy = True

    def __init__(self, sampler, *, last_step: int, max_staleness: int, score_ahead: bool, scorers: int = 1) -> None:
        from grpokit.train.experience.producer import Producer

        super().__init__(sampler)
        self.last_step, self.max_staleness, self.score_ahead = last_step, max_staleness, score_ahead
        self.producer = Producer(scorers)
        # admitted steps, in order: step -> global batch of prompt indices, and the reward state they are scored with
        self._batches: dict[int, tuple[list[int], Any]] = {}
        # a checkpoint's admitted steps: step -> (batch, reward state, collected rollouts), admitted again first
        self._restored: dict[int, tuple[list[int], Any, Rollouts | None]] = {}
        self._admitted = 0  # the last step admitted

    def next_scored(self, step: int, draw: Draw, score, reward_state, clock) -> Any:
        """Step ``step``'s Trajectory: the batch admitted K steps ago, collected (and scored) on the producer's
        thread; first admits every step up to ``step + K`` not admitted yet. ``time/generate`` is the wait."""
        self._admitted = max(self._admitted, step - 1)  # fresh or resumed: nothing before this step is due
        for ahead in range(self._admitted + 1, min(step + self.max_staleness, self.last_step) + 1):
            self._admit(ahead, draw, score, reward_state)
        self.sampler.share_weights()  # partial rollouts: batch ``step`` may continue on the current weights
        batch, state = self._batches.pop(step)
        rollouts, scored = self.producer.take(step)
        clock.lap("generate")
        if scored is None:  # several processes: the scoring's gathers run in the step, on every rank
            indices, _ = self.sampler.procs.shard(batch)
            scored = score(step, indices, self.sampler.scatter(rollouts), trainer_state=state)
        clock.lap("reward")
        return scored

    def _admit(self, step: int, draw: Draw, score, reward_state) -> None:
        """Admit ``step``: its batch drawn and submitted now (or a checkpoint's, collected already)."""
        if step in self._restored:
            batch, state, rollouts = self._restored.pop(step)

            def collect():
                return rollouts
        else:
            batch, state = draw(), reward_state(step)
            handle = self.sampler.submit(step, batch)  # the weights of now, the prompts and seeds of this step

            def collect():
                return None if handle is None else self.sampler.collect(handle)

        def scored(rollouts):  # their Trajectory; None: scored in the step
            return score(step, batch, rollouts, trainer_state=state) if self.score_ahead else None

        self._batches[step] = (batch, state)
        self._admitted = step
        self.producer.admit(step, collect, scored)  # rollouts: rank 0's global batch, None on other ranks

    def next(self, step: int, draw: Draw) -> tuple[list[int], Rollouts]:
        raise RuntimeError("rollouts sampled ahead are taken scored, with next_scored().")

    def more(self, step: int, batch: list[int], first_group: int) -> Rollouts:
        raise RuntimeError("rollouts sampled ahead; dynamic sampling's rounds need synchronous ones (max_staleness 0).")

    def settle(self) -> None:
        self.sampler.share_weights()  # partial rollouts: the admitted batches may continue on the current weights
        self.producer.settle()

    def metrics(self) -> dict[str, float]:
        waits = self.producer.counters()
        return {
            **self.sampler.metrics(),
            "async/learner_wait_s": waits["learner_wait"],
            "async/producer_wait_s": waits["producer_wait"],
        }

    def state_dict(self) -> tuple[list[int] | None, dict | None]:
        """Waits for the admitted batches; returns (None, {"queue": one entry per admitted step: step, prompt
        indices, the reward state's fields, rank 0's collected rollouts as a dict (None on other ranks)})."""
        self.settle()
        queue = []
        for step in sorted(self._batches):
            batch, state = self._batches[step]
            rollouts, _ = self.producer.peek(step)
            queue.append(
                {
                    "step": step,
                    "indices": list(batch),
                    "reward_state": None if state is None else dataclasses.asdict(state),
                    "rollouts": None if rollouts is None else dataclasses.asdict(rollouts),
                }
            )
        return None, {"queue": queue}

    def load_state_dict(self, indices: list[int] | None, rollouts: dict | None) -> bool:
        if rollouts is None or "queue" not in rollouts:
            return False
        from grpokit.rewards.contract import RewardState

        for entry in rollouts["queue"]:
            step = int(entry["step"])
            state = None if entry["reward_state"] is None else RewardState(**entry["reward_state"])
            collected = None if entry["rollouts"] is None else Rollouts.from_dict(entry["rollouts"])
            self._restored[step] = (list(entry["indices"]), state, collected)
        return True

    def close(self) -> None:
        self.sampler.interrupt()  # a batch admitted past the run's end may wait for weights that never come
        self.producer.close()
        super().close()


class ThreadSampler(EngineSampler):
    """Samples ahead in this process (``max_staleness`` >= 1 without Ray; the hf engine, one process): ``submit``
    takes a copy of the policy's weights now (their version: ``engine.policy_version``); ``collect``, on the
    producer's thread, loads them into the sampler's own copy of the model (``own_engine``, built on
    ``copy.deepcopy(model)``) and samples the whole batch in one call, its random stream seeded from (seed, step):
    the rollouts are a function of (seed, step, weights), whenever the thread runs. The learner's weights are never
    read while it trains. Memory: one more model, and up to K + 1 weight copies in the queue."""

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


@dataclass(frozen=True)
class Situation:
    """What decides a run's sampler: Ray rollout workers (``ray``), tool rollouts (``tools``), an engine that takes
    the raw prompts (``raw_prompts``: a rollout_func), rollouts that must not depend on the split over processes
    (``seeded``: seed_per_group, or several processes), sampling ahead in this process (``ahead``: max_staleness >= 1
    without Ray), a vLLM server as the engine (``server``)."""

    tools: bool
    ray: bool = False
    raw_prompts: bool = False
    seeded: bool = False
    ahead: bool = False
    server: bool = False


def _server_ahead(**parts: Any):
    from grpokit.train.experience.server_ahead import ServerAheadSampler  # it subclasses EngineSampler, above

    return ServerAheadSampler(**parts)


@dataclass(frozen=True)
class SamplerEntry:
    """A sampler kind: ``cls`` is built with the common parts (engine, prompts, procs, model, num_generations,
    params, seed) and the extras it ``needs`` (``remote``: the Ray workers; ``partial``: whether they continue partial
    rollouts; ``tools``: the ToolRollouts; ``prompt_column``; ``own_engine``: an engine on a copy of the policy;
    ``own_model``: a copy of the policy),
    which the composition root supplies by name; ``applies(situation)``: whether it samples a run in that
    :class:`Situation`."""

    cls: type
    applies: Callable[[Situation], bool]
    needs: tuple[str, ...] = ()


# The samplers by name, in order of precedence: the first that applies samples the run (the composition root,
# grpokit/compose/rollouts.py, asks :func:`pick_sampler`). Adding one is a class and one line here.
SAMPLERS = Registry(
    "sampler",
    {
        "ray": SamplerEntry(RaySampler, lambda s: s.ray, needs=("remote", "partial")),
        "server_ahead": SamplerEntry(_server_ahead, lambda s: s.ahead and s.server, needs=("own_model",)),
        "thread": SamplerEntry(ThreadSampler, lambda s: s.ahead, needs=("own_engine",)),  # a policy copy, ahead
        "tools": SamplerEntry(ToolSampler, lambda s: s.tools, needs=("tools",)),  # groups seeded, decoded in one batch
        "raw_prompts": SamplerEntry(RawPromptSampler, lambda s: s.raw_prompts, needs=("prompt_column",)),
        "group_seeded": SamplerEntry(GroupSeededSampler, lambda s: s.seeded),
        "engine": SamplerEntry(EngineSampler, lambda s: True),
    },
)


def pick_sampler(situation: Situation) -> SamplerEntry:
    """The first sampler of :data:`SAMPLERS` that applies to ``situation``."""
    return next(entry for entry in SAMPLERS.values() if entry.applies(situation))


# The sources by name: ahead with max_staleness >= 1 (async_rollouts: 1), else synchronous.
SOURCES = Registry("source", {"sync": SyncRollouts, "ahead": AheadRollouts})
