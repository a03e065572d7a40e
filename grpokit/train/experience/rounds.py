"""DAPO's dynamic sampling inside one training step (Yu et al. 2025, section 3.2), in one process.

A round samples a batch of prompts and scores it. Groups whose rewards all tie (zero advantage) are dropped, and
rounds follow until the step has its batch of informative groups or ``max_sampling_rounds`` rounds were sampled.
At the cap the step trains on the informative groups it found (the largest multiple of ``num_mini_batches`` of them,
so every mini-batch gets whole groups); with none, the step makes no update. Which groups are kept is
``algos.dynamic_sampling`` (pure); this module runs the rounds and joins their data. Every sampled group goes to
the store, the dropped ones with no advantage (``None``: not trained on).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import torch

from grpokit.algos.dynamic_sampling import SamplingRounds, add_round
from grpokit.algos.names import SAMPLING_GROUPS_TRAINED, SAMPLING_PROMPTS, SAMPLING_ROUNDS, SAMPLING_SHORT
from grpokit.rewards.runner import RewardResult
from grpokit.rollout.seeding import concat_rollouts
from grpokit.train.experience.trajectory import Trajectory


def sample_rounds(
    first: Trajectory,
    next_round: Callable[[int], Trajectory],
    *,
    target_groups: int,
    max_rounds: int,
    num_generations: int,
    num_mini_batches: int,
    pad_token_id: int,
) -> Trajectory:
    """Add rounds after ``first`` (``next_round(r)`` samples and scores round r >= 1) until ``target_groups``
    informative groups are found or ``max_rounds`` rounds were sampled. Returns every round joined in order, with
    ``train_rows`` the rows to train on (whole informative groups, in sampling order) and ``metrics`` the rounds,
    prompts and groups."""
    G = num_generations
    state = add_round(SamplingRounds(target_groups, max_rounds), first.reward.combined, G)
    rounds = [first]
    while not state.done:
        rounds.append(next_round(state.rounds))
        state = add_round(state, rounds[-1].reward.combined, G)
    starts = torch.tensor([0] + [len(r.completions) for r in rounds]).cumsum(0)  # [R + 1] first row of each round
    rows = torch.cat([state.rows(r, G) + starts[r] for r in range(len(rounds))])  # [kept * G]
    groups = len(state.kept) - len(state.kept) % num_mini_batches  # whole groups in every mini-batch
    metrics = {
        SAMPLING_ROUNDS: float(state.rounds),
        SAMPLING_PROMPTS: float(state.groups_seen),
        SAMPLING_GROUPS_TRAINED: float(groups),
        SAMPLING_SHORT: float(state.short),
    }
    return replace(join(rounds, pad_token_id), train_rows=rows[: groups * G], metrics=metrics)


def join(rounds: list[Trajectory], pad_token_id: int) -> Trajectory:
    """The rounds as one batch, in order (one round: itself)."""
    if len(rounds) == 1:
        return rounds[0]
    return Trajectory(
        [i for r in rounds for i in r.indices],
        concat_rollouts([r.rollouts for r in rounds], pad_token_id),
        [c for r in rounds for c in r.completions],
        join_rewards([r.reward for r in rounds]),
    )


def join_rewards(results: list[RewardResult]) -> RewardResult:
    """RewardResults of the same functions on consecutive completions as one: rows in order, error counts added,
    logged values pooled, ``log_extra`` columns None on the rows of a part that did not log them, times added."""
    sizes = [len(r.errors) for r in results]
    columns = dict.fromkeys(c for r in results for c in r.extra)
    logged = dict.fromkeys(name for r in results for name in r.logged)
    return RewardResult(
        names=results[0].names,
        per_func=torch.cat([r.per_func for r in results]),  # [N, F]
        combined=torch.cat([r.combined for r in results]),  # [N]
        errors=[e for r in results for e in r.errors],
        error_counts={name: sum(r.error_counts[name] for r in results) for name in results[0].names},
        logged={name: [v for r in results for v in r.logged.get(name, [])] for name in logged},
        extra={c: [v for r, n in zip(results, sizes) for v in r.extra.get(c, [None] * n)] for c in columns},
        seconds={name: sum(r.seconds.get(name, 0.0) for r in results) for name in results[0].seconds},  # in turn
    )


def renumber_repeats(records: list, num_generations: int) -> list:
    """Records of a step in which a prompt may have been drawn again by a later round (the data wrapped into a new
    epoch): the completions of its k-th group get completion_index k*G + g, so (step, prompt, completion) stays
    unique in the store."""
    seen: dict[int, int] = {}
    out = []
    for n, record in enumerate(records):
        if n % num_generations == 0:
            repeat = seen.get(record.prompt_index, 0)
            seen[record.prompt_index] = repeat + 1
        index = repeat * num_generations + record.completion_index
        out.append(replace(record, completion_index=index) if repeat else record)
    return out


# ---- how a step samples: one round, or dynamic sampling's rounds (chosen once by the composition root) ----------
# (step, this rank's prompt indices, their rollouts; keyword trainer_state: the rewards' RewardState, None: now's)
Score = Callable[..., Trajectory]


class SingleRound:
    """A step trains on one round: the rollout scheduler's batch, scored (``score``, the trainer's; ``reward_state``:
    the trainer_state of a step's rewards, taken when a batch sampled ahead is drawn)."""

    def __init__(self, scheduler, score: Score, reward_state=None):
        self.scheduler, self.score, self.reward_state = scheduler, score, reward_state

    def sample(self, step: int, clock) -> Trajectory:
        """The step's :class:`Trajectory`; ``clock`` (a PhaseClock) times its generate and reward phases (sampled
        ahead: the wait for a batch sampled and scored in the background)."""
        return self.scheduler.next_scored(step, self.score, self.reward_state, clock)


class DynamicRounds(SingleRound):
    """DAPO's dynamic sampling (one process): after the first round, more rounds (``scheduler.more``) until
    ``target_groups`` informative groups are found or ``max_rounds`` rounds were sampled (:func:`sample_rounds`)."""

    def __init__(
        self,
        scheduler,
        score: Score,
        *,
        target_groups: int,
        max_rounds: int,
        num_generations: int,
        num_mini_batches: int,
        pad_token_id: int,
    ):
        super().__init__(scheduler, score)
        self.target_groups, self.max_rounds = target_groups, max_rounds
        self.num_generations, self.num_mini_batches, self.pad_token_id = num_generations, num_mini_batches, pad_token_id

    def sample(self, step: int, clock) -> Trajectory:
        def next_round(r: int) -> Trajectory:
            indices, rollouts = self.scheduler.more(step, r)
            clock.lap("generate")
            trajectory = self.score(step, indices, rollouts)
            clock.lap("reward")
            return trajectory

        rounds = sample_rounds(
            super().sample(step, clock),
            next_round,
            target_groups=self.target_groups,
            max_rounds=self.max_rounds,
            num_generations=self.num_generations,
            num_mini_batches=self.num_mini_batches,
            pad_token_id=self.pad_token_id,
        )
        return replace(rounds, all_rewards=None)  # one process: this rank's rewards are the global batch's
