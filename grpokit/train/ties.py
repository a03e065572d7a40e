"""Loud no-signal runs: a warning when every group has tied for ``warn_tied_steps`` steps in a row.

A group-relative advantage (GRPO, RLOO, REINFORCE++) is zero for a group whose G completions got the same reward,
so a step where every group ties updates nothing (only the KL term moves the policy). A reward that cannot tell
completions apart (a wrong column, a format the model never hits, an answer it never finds) makes a whole run do
that, quietly: its curves are flat, which looks like a slow start. :class:`TieWatch` counts such steps and, once
the streak reaches the limit, says so, naming each reward function and the values it gave over the streak. Runs
with a learned baseline (PPO's critic) or groups of one (G = 1) learn from tied rewards, so they are not watched.
"""

from __future__ import annotations

import math

import torch

from grpokit.algos import zero_variance_groups

# Distinct values of one function listed by name; more are given as a count and a range.
_MAX_LISTED = 4


class TieWatch:
    """Counts the steps in a row on which every group tied; :meth:`step` returns the warning once per streak,
    on its ``limit``-th step (``limit`` 0: never)."""

    def __init__(self, limit: int, num_generations: int, group_relative: bool = True):
        self.limit = limit if group_relative and num_generations > 1 else 0
        self.num_generations = num_generations
        self.streak = 0
        self._values: dict[str, set] = {}

    def step(self, step: int, names: list[str], per_func: torch.Tensor, combined: torch.Tensor) -> str | None:
        """Record step ``step``'s rewards (every process's): ``per_func`` [N, F] (NaN: no value) of the functions
        ``names``, ``combined`` [N]; the warning when this step makes the streak ``limit`` long, else None."""
        if self.limit <= 0:
            return None
        if not bool(zero_variance_groups(combined, self.num_generations).all()):
            self.streak, self._values = 0, {}
            return None
        self.streak += 1
        for i, name in enumerate(names):
            self._values.setdefault(name, set()).update(_value(v) for v in per_func[:, i].tolist())
        if self.streak != self.limit:
            return None
        first = step - self.limit + 1
        values = "; ".join(f"{name} {_describe(self._values.get(name, set()))}" for name in names)
        return (
            f"steps {first}-{step}: in every group all {self.num_generations} completions got the same reward, so "
            f"the advantages were 0 and nothing was learned from the rewards ({values}). Check that the reward "
            "functions can tell completions apart on this data and model (its column, its format); "
            "warn_tied_steps: 0 turns this warning off."
        )


def _value(v: float) -> float | None:
    return None if math.isnan(v) else v


def _describe(values: set) -> str:
    """``gave 0`` / ``gave 0 or 1`` / ``gave 7 values from -1 to 0.5``, and ``no value`` for None."""
    numbers = sorted(v for v in values if v is not None)
    parts = []
    if len(numbers) > _MAX_LISTED:
        parts.append(f"{len(numbers)} values from {numbers[0]:.4g} to {numbers[-1]:.4g}")
    elif numbers:
        parts.append(" or ".join(f"{v:.4g}" for v in numbers))
    if None in values:
        parts.append("no value (None)")
    return "gave " + " or ".join(parts) if parts else "gave nothing"
