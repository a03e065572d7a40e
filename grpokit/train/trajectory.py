"""What flows from sampling and scoring to the learner within a step, as typed objects.

:class:`Trajectory`: a step's sampled and scored groups (this rank's prompt indices, their rollouts, the decoded
completions and rewards) and which of their rows the step trains on. The step's sampling strategies (one round,
or DAPO's dynamic sampling rounds) build it; the learner's inputs are :class:`grpokit.train.learner.UpdateInputs`
and :class:`grpokit.train.learner.TrainingBatch`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from grpokit.rollout.types import Rollouts

if TYPE_CHECKING:
    from grpokit.rewards.runner import RewardResult


@dataclass
class Trajectory:
    """Scored groups: ``indices`` the prompt index of each group (this rank's), ``rollouts`` (G per prompt),
    ``completions`` the decoded completions [N], ``reward`` this rank's RewardResult and ``all_rewards`` every
    rank's (None: one process, the same as ``reward``). ``train_rows``: long [k*G], the rows the step trains on
    (whole groups, in order; None: every row); ``metrics``: the sampling's own metrics (dynamic sampling's)."""

    indices: list[int]
    rollouts: Rollouts
    completions: list[str]
    reward: RewardResult
    all_rewards: RewardResult | None = None
    train_rows: torch.Tensor | None = None
    metrics: dict[str, float] = field(default_factory=dict)

    @property
    def global_rewards(self) -> RewardResult:
        """Every rank's rewards (the step's reward metrics cover them)."""
        return self.reward if self.all_rewards is None else self.all_rewards

    @property
    def trained(self) -> Rollouts:
        """The rollouts the step trains on."""
        if self.train_rows is None:
            return self.rollouts
        from grpokit.train.dynamic_sampling import take_rows

        return take_rows(self.rollouts, self.train_rows)

    @property
    def trained_rewards(self) -> torch.Tensor:
        """[N_global] the combined rewards of the rows trained on, every rank's (their groups' advantages)."""
        combined = self.global_rewards.combined
        return combined if self.train_rows is None else combined[self.train_rows]

    def stored_advantages(self, advantages: torch.Tensor) -> torch.Tensor:
        """[N] the advantage of every sampled completion for the store: NaN where not trained on."""
        if self.train_rows is None:
            return advantages
        from grpokit.train.dynamic_sampling import stored_advantages

        return stored_advantages(advantages, self.train_rows, len(self.completions))
