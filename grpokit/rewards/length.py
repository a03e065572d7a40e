"""``length``: penalise completions by their length.

Two modes. DAPO's soft overlong punishment (Yu et al. 2025, "DAPO: An Open-Source LLM
Reinforcement Learning System at Scale", eq. 13), with L_max = ``max_length`` and
L_cache = ``cache_length``::

    R(y) = 0                                   if |y| <= L_max - L_cache
           ((L_max - L_cache) - |y|) / L_cache  if L_max - L_cache < |y| <= L_max
           -1                                  if |y| > L_max

and a target length: R(y) = max(-1, -| |y| - target | / target).

|y| is counted in tokens from the ``completion_lengths`` column (list[int], passed by the
trainer) or in characters of the completion text; ``unit="auto"`` uses tokens when that column
is given and characters otherwise.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from grpokit.rewards.contract import require_column, texts_of
from grpokit.rewards.registry import BUILTINS

UNITS = ("auto", "tokens", "chars")
LENGTH_COLUMN = "completion_lengths"


def overlong_penalty(length: int, max_length: int, cache_length: int) -> float:
    """DAPO soft overlong punishment (eq. 13) of one completion of ``length``; in [-1, 0]."""
    soft_limit = max_length - cache_length
    if length <= soft_limit:
        return 0.0
    if length <= max_length:
        return (soft_limit - length) / cache_length
    return -1.0


def target_length_penalty(length: int, target_length: int) -> float:
    """-| length - target | / target, clipped at -1; 0 exactly at the target."""
    return max(-1.0, -abs(length - target_length) / target_length)


@BUILTINS.register("length")
class LengthReward:
    """Length penalty: DAPO overlong (``max_length`` + ``cache_length``) or ``target_length``."""

    name = "length"

    def __init__(
        self,
        max_length: int | None = None,
        cache_length: int | None = None,
        target_length: int | None = None,
        unit: str = "auto",
    ):
        overlong = max_length is not None or cache_length is not None
        if overlong == (target_length is not None):
            raise ValueError(
                "length reward: give max_length and cache_length (DAPO overlong penalty) or target_length, not both"
            )
        if overlong and (max_length is None or cache_length is None or not 0 < cache_length <= max_length):
            raise ValueError(
                "length reward: need 0 < cache_length <= max_length, "
                f"got max_length={max_length}, cache_length={cache_length}"
            )
        if target_length is not None and target_length <= 0:
            raise ValueError(f"length reward: target_length must be > 0, got {target_length}")
        if unit not in UNITS:
            raise ValueError(f"length reward: unit must be one of {UNITS}, got {unit!r}")
        self.max_length = max_length
        self.cache_length = cache_length
        self.target_length = target_length
        self.unit = unit

    def lengths(self, completions: Sequence[str], columns: dict[str, Any]) -> Sequence[int]:
        """Length of each completion in the configured unit."""
        if self.unit == "chars" or (self.unit == "auto" and LENGTH_COLUMN not in columns):
            return [len(completion) for completion in texts_of(completions)]
        return require_column(columns, LENGTH_COLUMN, self.name)

    def __call__(self, prompts: Sequence[str], completions: Sequence[str], **columns: Any) -> list[float]:
        if self.target_length is not None:
            return [target_length_penalty(n, self.target_length) for n in self.lengths(completions, columns)]
        return [overlong_penalty(n, self.max_length, self.cache_length) for n in self.lengths(completions, columns)]
