"""What flows from sampling and scoring to the learner within a step, as typed objects.

:class:`Trajectory`: a step's sampled and scored groups (this rank's prompt indices, their rollouts, the decoded
completions and rewards) and which of their rows the step trains on. The step's sampling strategies (one round,
or DAPO's dynamic sampling rounds) build it; the learner's inputs are ``learning.learner.UpdateInputs``
and :class:`grpokit.train.learning.learner.TrainingBatch`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import torch

from grpokit.rollout.types import COMPLETION_IMAGE_FIELDS, Rollouts

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
        return take_rows(self.rollouts, self.train_rows)

    @property
    def trained_rewards(self) -> torch.Tensor:
        """[N_global] the combined rewards of the rows trained on, every rank's (their groups' advantages)."""
        combined = self.global_rewards.combined
        return combined if self.train_rows is None else combined[self.train_rows]

    @property
    def trained_per_func(self) -> torch.Tensor:
        """[N_global, F] each reward function's rewards of the rows trained on (NaN: none)."""
        per_func = self.global_rewards.per_func
        return per_func if self.train_rows is None else per_func[self.train_rows]

    def stored_advantages(self, advantages: torch.Tensor) -> torch.Tensor:
        """[N] the advantage of every sampled completion for the store: NaN where not trained on."""
        if self.train_rows is None:
            return advantages
        return stored_advantages(advantages, self.train_rows, len(self.completions))


def take_rows(rollouts: Rollouts, rows: torch.Tensor) -> Rollouts:
    """The completions at ``rows`` (long [k*G], whole groups in order) as Rollouts of their k prompts."""
    G = rollouts.num_generations
    picked = rows.tolist()
    return replace(
        rollouts,
        prompt_ids=[rollouts.prompt_ids[n // G] for n in picked[::G]],
        completion_ids=rollouts.completion_ids[rows],  # [k*G, T]
        completion_mask=rollouts.completion_mask[rows],  # [k*G, T]
        logprobs=rollouts.logprobs[rows],  # [k*G, T]
        finish_reasons=[rollouts.finish_reasons[n] for n in picked],
        loss_mask=None if rollouts.loss_mask is None else rollouts.loss_mask[rows],  # [k*G, T]
        conversations=None if rollouts.conversations is None else [rollouts.conversations[n] for n in picked],
        columns=None
        if rollouts.columns is None
        else {name: [values[n] for n in picked] for name, values in rollouts.columns.items()},
        **{  # the images tools showed in each completion (pixel inputs, images, hashes): the picked rows'
            name: None if getattr(rollouts, name) is None else [getattr(rollouts, name)[n] for n in picked]
            for name in COMPLETION_IMAGE_FIELDS
        },
    )


def stored_advantages(advantages: torch.Tensor, train_rows: torch.Tensor, size: int) -> torch.Tensor:
    """[size] advantages of every sampled completion for the store: the trained rows' ``advantages`` [k*G], NaN
    (stored as None: not trained on) elsewhere."""
    out = torch.full((size,), float("nan"))
    out[train_rows] = advantages.float().cpu()
    return out
