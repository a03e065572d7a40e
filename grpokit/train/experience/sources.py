"""Rollout sources: where a step's rollouts come from and when, one small class per mode, behind one interface.

A *source* decides when a batch is sampled: :class:`SyncRollouts` in the step (and further rounds within it, for
dynamic sampling), :class:`AheadRollouts` up to ``max_staleness`` K steps ahead (async; K = 1 is
``async_rollouts``' one-step-off), collected and scored on a background thread. The samplers (what turns a batch
into rollouts) are :mod:`grpokit.train.experience.samplers` and :mod:`grpokit.train.experience.server_ahead`; the
composition root picks one of each from :data:`SAMPLERS` and :data:`SOURCES`; the rollout scheduler only
dispatches to them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Protocol

from grpokit.rollout.types import Rollouts
from grpokit.system.registry import Registry
from grpokit.train.experience.sampler_entry import SamplerEntry, Situation
from grpokit.train.experience.sampler_entry import pick_sampler as pick_entry
from grpokit.train.experience.samplers import (
    EngineSampler,
    GroupSeededSampler,
    RawPromptSampler,
    RaySampler,
    Sampler,
    ThreadSampler,
    ToolSampler,
)
from grpokit.train.experience.server_ahead import ServerAheadSampler

Draw = Callable[[], list[int]]  # the next global batch of prompt indices


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
        # called on the producer's thread with each batch's collected rollouts, before they are scored, in one process
        # (score_ahead): a served teacher's request for them starts there (grpokit/train/teacher/distiller.py)
        self.on_collected: Callable[[Rollouts], None] | None = None

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
            if self.on_collected is not None and self.score_ahead and rollouts is not None:
                self.on_collected(rollouts)
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
                    "rollouts": None if rollouts is None else _saved(rollouts),
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
            if collected is not None:
                collected.prompt_ids = self._with_pixels(step, collected.prompt_ids, entry["indices"])
            self._restored[step] = (list(entry["indices"]), state, collected)
        return True

    def _with_pixels(self, step: int, saved: list, indices: list[int]) -> list:
        """A checkpoint's queued prompt ids (plain lists) with the pixel inputs the resumed run encoded for the
        same prompts (``indices``: the global batch, in the rollouts' order); a DataError when they differ."""
        from grpokit.data.prompts import DataError
        from grpokit.models.vision_inputs import reattach

        prompts = getattr(self.sampler, "prompts", None)
        if prompts is None:
            return saved
        found = reattach(saved, [prompts.ids[i] for i in indices])
        if found is None:
            raise DataError(
                f"the checkpoint's queued rollouts of step {step} were sampled on prompts with images that this "
                "run's dataset and processor no longer encode to the same tokens; resume with the run's own."
            )
        return found

    def close(self) -> None:
        self.sampler.interrupt()  # a batch admitted past the run's end may wait for weights that never come
        self.producer.close()
        super().close()


def _saved(rollouts: Rollouts) -> dict:
    """Rollouts as a checkpoint holds them: their prompts as plain id lists (a VisionPrompt's pixel inputs are
    encoded again from the dataset on resume: ``reattach``)."""
    from grpokit.models.vision_inputs import plain

    return dataclasses.asdict(dataclasses.replace(rollouts, prompt_ids=plain(rollouts.prompt_ids)))


# The samplers by name, each with the situations it serves (sampler_entry.SamplerEntry's flags, exclusive: the
# composition root, grpokit/compose/rollouts.py, asks pick_sampler for the one that serves the run). Adding one is a
# class with ``from_inputs`` and its registration here, with flags no other entry's overlap.
SAMPLERS = Registry("sampler", entry=lambda name, cls, **fields: SamplerEntry(cls, **fields))
SAMPLERS.register("ray", ray=True)(RaySampler)
SAMPLERS.register("server_ahead", ray=False, ahead=True, server=True)(ServerAheadSampler)
SAMPLERS.register("thread", ray=False, ahead=True, server=False)(ThreadSampler)  # a policy copy, ahead
SAMPLERS.register("tools", ray=False, ahead=False, tool_rollouts=True)(ToolSampler)  # groups seeded, one batch
SAMPLERS.register("raw_prompts", ray=False, ahead=False, tool_rollouts=False, raw_prompts=True)(RawPromptSampler)
NOT_SPECIAL = {"ray": False, "ahead": False, "tool_rollouts": False, "raw_prompts": False}
SAMPLERS.register("group_seeded", seeded=True, **NOT_SPECIAL)(GroupSeededSampler)
SAMPLERS.register("engine", seeded=False, **NOT_SPECIAL)(EngineSampler)


def pick_sampler(situation: Situation) -> SamplerEntry:
    """The one sampler of :data:`SAMPLERS` that serves ``situation`` (a ValueError naming them when none or two do)."""
    return pick_entry(situation, SAMPLERS)


# The sources by name: ahead with max_staleness >= 1 (async_rollouts: 1), else synchronous.
SOURCES = Registry("source")
SOURCES.register("sync")(SyncRollouts)
SOURCES.register("ahead")(AheadRollouts)


def pick_source(ahead: bool) -> type:
    """The one source of :data:`SOURCES` whose ``off_policy`` is ``ahead`` (the run samples ahead: max_staleness >=
    1); a ValueError when none or two are."""
    names = [name for name, cls in SOURCES.items() if cls.off_policy == ahead]
    if len(names) != 1:
        raise ValueError(f"rollout sources with off_policy={ahead}: {names or 'none'}; exactly one must be.")
    return SOURCES[names[0]]
