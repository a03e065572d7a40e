"""Scoring a round of rollouts: decode them, call the reward functions (every rank's rows, so groups are complete and
batch-level scaling sees the whole batch), and hand back a :class:`~grpokit.train.experience.trajectory.Trajectory`."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from grpokit.data.prompts import reward_arguments
from grpokit.rewards.contract import RewardState
from grpokit.system.processes import RewardBatch
from grpokit.train.experience.trajectory import Trajectory


def reward_state(source, max_steps: int, step: int) -> RewardState:
    """``trainer_state`` for the reward functions while step ``step`` is scored (TRL passes its state before the
    step's update: ``global_step`` counts the updates done); ``source``: the training PromptSource (its epoch)."""
    epoch = source.epoch + source.position / len(source.usable)
    return RewardState(global_step=step - 1, max_steps=max_steps, epoch=epoch)


_DECODING = threading.Lock()  # one decode at a time: scoring threads share the tokenizer (a fast one refuses that)


@dataclass(frozen=True)
class Scorer:
    """Scores a round: ``rows`` the training rows, ``source`` their PromptSource, ``tool_rollouts`` (None without
    tools), ``on_main``: Ray reward workers on rank 0 score every rank's rows."""

    rows: list[dict]
    source: Any
    tokenizer: Any
    rewards: Any
    procs: Any
    tool_rollouts: Any
    num_generations: int
    max_steps: int
    prompt_column: str
    on_main: bool = False

    def state(self, step: int) -> RewardState:
        """The rewards' ``trainer_state`` for step ``step`` now (a batch sampled ahead takes it when drawn)."""
        return reward_state(self.source, self.max_steps, step)

    def __call__(self, step: int, indices: list[int], rollouts, trainer_state: RewardState | None = None) -> Trajectory:
        """This rank's ``rollouts`` of the prompts ``indices``, decoded and scored (this rank's RewardResult and
        every rank's); ``trainer_state``: the rewards' (None: now's, :meth:`state`)."""
        with _DECODING:
            prompts, completions, columns, completion_ids = reward_arguments(
                self.rows, indices, rollouts, self.tokenizer, self.prompt_column
            )
        scored = completions  # tool rollouts: their messages (and environments), as TRL passes them
        if rollouts.conversations is not None:
            prompts, scored, columns = self.tool_rollouts.reward_inputs(prompts, rollouts.conversations, columns)
        state = trainer_state or self.state(step)
        batch = RewardBatch(prompts, scored, columns, self.num_generations, completion_ids, state)
        reward, all_rewards = self.procs.score_rewards(self.rewards, batch, on_main=self.on_main)
        return Trajectory(indices, rollouts, completions, reward, all_rewards)
