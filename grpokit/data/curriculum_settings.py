"""The curriculum's settings (:mod:`grpokit.data.curriculum`): keys of the ``data`` section, which is assembled from
this class; torch-free."""

from __future__ import annotations

from dataclasses import dataclass

from grpokit.errors import ConfigError, require


@dataclass
class CurriculumSettings:
    """Which prompts each step draws, from each prompt's history in the rollout store (its prompt_history table)."""

    curriculum: str = "uniform"
    """uniform (the dataset order, shuffled per `shuffle`) | learnability (prompts drawn in proportion to p(1 - p) of
    their recent pass rate p) | a name registered with grpokit.data.curriculum.register_curriculum."""
    history_window: int = 16
    """A prompt's pass rate, mean reward and reward variance in the store are over its last this many completions
    (a completion passes at reward >= eval.success_threshold)."""
    learnability_prior: float = 0.5
    """learnability: the pass rate assumed for a prompt not sampled yet (0.5: weight 0.25, the highest)."""
    learnability_floor: float = 0.01
    """learnability: the least weight of a prompt (solved or hopeless ones weigh 0 otherwise), so none starves."""

    def check(self) -> None:
        from grpokit.data.curriculum import CURRICULA, curriculum_names

        try:
            CURRICULA.entry(self.curriculum, curriculum_names())
        except ValueError as exc:
            raise ConfigError(
                f"{exc} (a curriculum of your own: grpokit.data.curriculum.register_curriculum in a module named by "
                "algo.imports)."
            ) from None
        require(self.history_window >= 1, f"history_window={self.history_window} must be >= 1.")
        require(
            0.0 <= self.learnability_prior <= 1.0,
            f"learnability_prior={self.learnability_prior} is a pass rate; give a value in [0, 1].",
        )
        require(
            0.0 < self.learnability_floor <= 0.25,
            f"learnability_floor={self.learnability_floor} must be in (0, 0.25] (p(1 - p) is at most 0.25); a floor of"
            " 0 would let a solved prompt starve.",
        )
