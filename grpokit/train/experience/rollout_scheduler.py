"""Which prompts each step trains on, and their rollouts, however they are sampled.

- sync (the default): the step's global batch of prompts is drawn and sampled in the step, by the
  colocated engine (HF, or vLLM with ``engine: vllm``) or, with ``backend: ray``, by Ray rollout workers.
- ahead (``max_staleness`` K >= 1; ``async_rollouts`` is K = 1): step s + K's batch is drawn and submitted
  (Ray workers, or a copy of the policy on a background thread) before step s trains, so sampling and scoring
  overlap the updates, at most K updates behind. The admitted batches are part of a checkpoint (their prompt
  indices, and their rollouts collected), so a resume trains on the same data.
- dynamic sampling (DAPO, sync, one process): ``more(step, r)`` draws and samples round r's further batch
  within the step (``train/experience/rounds.py`` runs the rounds).

Under torchrun every rank draws the same global batch and keeps its share of groups (``procs.shard``); a
curriculum that draws by the prompts' history (which only rank 0 holds, in the store) draws on rank 0, which
broadcasts the batch; with Ray, rank 0 drives the workers and scatters each rank's share. Rollouts must not depend
on that split, so then each group is sampled with its own seed (:mod:`grpokit.rollout.seeding`).

Each mode is a small rollout source (:mod:`grpokit.train.experience.sources`) picked once by the composition root;
the scheduler draws the prompts, dispatches to its source and keeps the checkpoint state.
"""

from __future__ import annotations

from grpokit.data.prompts import DataError, PromptSource
from grpokit.rollout.types import Rollouts, SamplingParams
from grpokit.train.experience.sources import RolloutSource


class RolloutScheduler:
    """``next(step)`` -> this rank's prompt indices and their rollouts (G per prompt) for ``step``.

    ``source``: the run's :class:`~grpokit.train.experience.sources.RolloutSource`; ``engine``: the rollout engine
    sampling in this process (its policy version and random stream are checkpointed); ``prompts``: the training
    PromptSource, of which each step draws ``prompts_per_step`` (the global batch); ``procs``: the
    :class:`~grpokit.system.processes.SingleProcess` context (or a torchrun rank's); ``sampling``: the run's
    SamplingParams; ``tool_rollouts``: the run's ToolRollouts (multi-turn tool rollouts), or None; ``sync_check``:
    the engine when its registry entry checks the sampler-learner log-prob gap after each step (``sync_gap_warning``,
    ``sync_gap_stop``: vLLM's own copy of the weights), else None.
    """

    def __init__(
        self,
        *,
        source: RolloutSource,
        engine,
        prompts: PromptSource,
        procs,
        prompts_per_step: int,
        sampling: SamplingParams,
        tool_rollouts=None,
        sync_check=None,
    ):
        self.source, self.engine, self.prompts, self.procs = source, engine, prompts, procs
        self.sync_check = sync_check
        self.prompts_per_step, self.sampling, self.tool_rollouts = prompts_per_step, sampling, tool_rollouts
        self._resume_indices: list[int] | None = None  # a checkpoint's drawn batch, not yet sampled

    def next(self, step: int) -> tuple[list[int], Rollouts]:
        """This rank's prompt indices for ``step`` and their rollouts (one step off: sampled while the previous
        step trained, and the next step's sampling starts here)."""
        batch, rollouts = self.source.next(step, self._draw)
        indices, _ = self.procs.shard(batch)
        return indices, rollouts

    def next_scored(self, step: int, score, reward_state, clock):
        """``step``'s Trajectory: this rank's prompts, their rollouts scored by ``score`` (the trainer's); sampled
        ahead, it was scored on the producer's thread with ``reward_state(step)`` taken when its batch was drawn."""
        return self.source.next_scored(step, self._draw, score, reward_state, clock)

    def settle(self) -> None:
        """Wait for the rollouts sampled ahead in the background to finish (none: at once)."""
        self.source.settle()

    def more(self, step: int, round_index: int) -> tuple[list[int], Rollouts]:
        """Dynamic sampling's round ``round_index`` (>= 1) of ``step`` (sync, one process): a fresh batch of prompts
        and their rollouts. With a seed per group, its groups number on after the earlier rounds'."""
        batch = self._draw()
        return batch, self.source.more(step, batch, round_index * len(batch))

    def metrics(self) -> dict[str, float]:
        """Sampling's metrics of the last step: Ray worker restarts, tool calls (multi-turn rollouts)."""
        return self.source.metrics()

    def state_dict(self) -> tuple[dict, dict | None]:
        """(the checkpoint's trainer-state entries, the rollouts sampled ahead (their queue) or None)."""
        indices, pending = self.source.state_dict()
        state = {
            "policy_version": self.engine.policy_version,
            "pending_indices": indices,  # async: drawn, not yet trained on
        }
        return state, pending

    def load_state_dict(self, state: dict, pending_rollouts: dict | None) -> None:
        self.engine.policy_version = int(state["policy_version"])
        self._resume_indices = state.get("pending_indices")
        if self.source.load_state_dict(self._resume_indices, pending_rollouts):
            self._resume_indices = None  # async: the step after the checkpoint was sampled before it

    def close(self) -> None:
        self.source.close()

    def _draw(self) -> list[int]:
        """The next global batch of prompt indices (every rank draws the same batch, or gets rank 0's when a
        curriculum draws by the history); first a checkpoint's."""
        if self._resume_indices:
            batch, self._resume_indices = self._resume_indices, None
            return batch
        if self.procs.enabled and self.prompts.drawn_by_history:
            return self._draw_on_main()
        return self.prompts.next_indices(self.prompts_per_step)

    def _draw_on_main(self) -> list[int]:
        """Rank 0's draw, broadcast to every rank (called on every rank's main thread, in the same order). A failure
        on rank 0 is broadcast instead and raised on every rank, so the others stop instead of waiting."""
        drawn, failure = None, None
        if self.procs.is_main:
            try:
                drawn = self.prompts.next_indices(self.prompts_per_step)
            except Exception as exc:
                failure, drawn = exc, f"rank 0 could not draw the step's prompts: {type(exc).__name__}: {exc}"
        drawn = self.procs.broadcast_object(drawn)
        if failure is not None:
            raise failure
        if isinstance(drawn, str):
            raise DataError(drawn)
        return drawn
