"""The reward runner's settings (:mod:`grpokit.rewards.runner`): the ``reward`` section; torch-free."""

from __future__ import annotations

import math
from dataclasses import dataclass

from grpokit.errors import require


@dataclass
class RewardSettings:
    """How the reward functions are weighted, isolated and timed."""

    reward_weights: list | None = None
    """Weights of the reward functions (one per function); default 1 each."""
    reward_timeout: float = 10.0
    """Seconds a reward function may take per batch before its values become None (its worker process is killed)."""
    reward_workers: int = 0
    """Worker processes per reward function, each scoring a chunk of whole groups (CPU-heavy rewards); 0 = one."""
    reward_isolation: bool | None = None
    """true: each reward function in a worker process, killed at its timeout; false: threads in the trainer, where a
    timeout cannot stop code that holds the GIL; null: rewards named by a string (built-ins, module:function,
    file.py:function) in worker processes, functions passed from Python in the trainer's process (as TRL)."""

    def check(self) -> None:
        require(
            self.reward_workers >= 0,
            f"reward_workers={self.reward_workers} must be >= 0 (0 = one process per function).",
        )
        for w in self.reward_weights or []:
            require(
                isinstance(w, (int, float)) and not isinstance(w, bool) and math.isfinite(w),
                f"reward_weights contains {w!r}; each weight must be a finite number.",
            )
        require(self.reward_timeout > 0, f"reward_timeout={self.reward_timeout} must be > 0 seconds.")
