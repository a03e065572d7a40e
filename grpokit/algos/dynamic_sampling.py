"""DAPO's dynamic sampling: keep only the groups whose rewards differ, sample more until the batch is full.

Yu et al. 2025, "DAPO: An Open-Source LLM Reinforcement Learning System at Scale", section 3.2: a
group whose G rewards are all equal has zero advantage, so it adds no gradient and only shrinks the
effective batch. Such groups are dropped and more prompts are sampled, round after round, until the
step has its ``target_groups`` informative groups (extra ones of the last round are left out), or
until ``max_rounds`` rounds were sampled. Rewards [B*G] of one round, the G completions of a prompt
adjacent, as everywhere in ``algos``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from grpokit.algos.advantages import zero_variance_groups


def informative_groups(rewards: torch.Tensor, num_generations: int) -> torch.Tensor:
    """Bool [B], True for a group whose (non-NaN) rewards are not all equal (std > 0), [B*G] -> [B]."""
    constant = zero_variance_groups(rewards, num_generations)  # [B*G]
    return ~constant.view(-1, num_generations)[:, 0]  # [B*G] -> [B, G] -> [B]


@dataclass(frozen=True)
class SamplingRounds:
    """Where a step's dynamic sampling stands after some rounds.

    ``kept``: (round, group) of each informative group kept, in sampling order; ``groups_seen``: groups
    sampled so far (prompts used). ``done``: stop sampling (the target is reached, or ``max_rounds``);
    ``short``: stopped by the cap with fewer groups than the target (the caller trains on ``kept`` or
    skips the step, and should log it).
    """

    target_groups: int
    max_rounds: int
    kept: tuple[tuple[int, int], ...] = ()
    rounds: int = 0
    groups_seen: int = 0

    def __post_init__(self):
        if self.target_groups < 1:
            raise ValueError(f"dynamic sampling needs target_groups >= 1, got {self.target_groups}")
        if self.max_rounds < 1:
            raise ValueError(f"dynamic sampling needs max_rounds >= 1, got {self.max_rounds}")

    @property
    def done(self) -> bool:
        return len(self.kept) >= self.target_groups or self.rounds >= self.max_rounds

    @property
    def short(self) -> bool:
        return len(self.kept) < self.target_groups and self.rounds >= self.max_rounds

    def rows(self, round_index: int, num_generations: int) -> torch.Tensor:
        """Row indices (long [k*G]) into round ``round_index``'s [B*G] tensors of the groups kept from it."""
        groups = torch.tensor([g for r, g in self.kept if r == round_index], dtype=torch.long)  # [k]
        offsets = torch.arange(num_generations)  # [G]
        return (groups[:, None] * num_generations + offsets).reshape(-1)  # [k, G] -> [k*G]


def add_round(state: SamplingRounds, rewards: torch.Tensor, num_generations: int) -> SamplingRounds:
    """``state`` after one more sampling round with ``rewards`` [B*G]: its informative groups kept, in
    order, up to ``target_groups`` in all. Refuses a round after ``state.done``."""
    if state.done:
        raise ValueError(
            f"dynamic sampling is done after {state.rounds} rounds ({len(state.kept)} of {state.target_groups} groups)"
        )
    keep = informative_groups(rewards, num_generations)  # [B]
    room = state.target_groups - len(state.kept)
    new = [(state.rounds, g) for g in keep.nonzero().flatten().tolist()[:room]]
    return SamplingRounds(
        state.target_groups,
        state.max_rounds,
        state.kept + tuple(new),
        state.rounds + 1,
        state.groups_seen + keep.numel(),
    )


def zero_variance_counts(
    rewards: torch.Tensor, num_generations: int, train_rows: torch.Tensor | None = None
) -> tuple[int, int, int]:
    """(groups sampled, those whose rewards all tie, those of them in the rows trained on) of a step's ``rewards``
    [B*G] (every round); ``train_rows`` long [k*G], whole groups (None: every row is trained on). Rewards 1 1 | 0 1
    | .5 .5, all trained: (3, 2, 2); trained rows [2, 3] (the second group): (3, 2, 0)."""
    constant = informative_groups(rewards, num_generations).logical_not()  # [B]
    kept = constant if train_rows is None else constant[train_rows.view(-1, num_generations)[:, 0] // num_generations]
    return constant.numel(), int(constant.sum()), int(kept.sum())
