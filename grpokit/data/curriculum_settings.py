"""The curriculum's settings (:mod:`grpokit.data.curriculum`): keys of the ``data`` section, which is assembled from
this class; torch-free."""

from __future__ import annotations

from dataclasses import dataclass, field

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
    pool_easy_above: float = 0.8
    """pools: a prompt whose pass rate is >= this is in the easy pool."""
    pool_hard_below: float = 0.2
    """pools: a prompt whose pass rate is <= this is in the hard pool; the others, and prompts never sampled, are
    normal."""
    pool_weights: list = field(default_factory=lambda: [0.1, 0.8, 0.1])
    """pools: the share of draws of the easy, normal and hard pools, [easy, normal, hard] (an empty pool's share goes
    to the others in proportion)."""
    retire_after: int | None = None
    """A prompt every completion of which passed in this many visits in a row is retired: drawn at retire_revisit
    times its weight until a visit fails (forgetting brings it back); null = never. learnability and pools only."""
    retire_revisit: float = 0.1
    """The factor on a retired prompt's weight (> 0, so retired prompts are still revisited now and then)."""

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
        self._check_pools_and_retiring()

    def _check_pools_and_retiring(self) -> None:
        require(
            0.0 <= self.pool_hard_below < self.pool_easy_above <= 1.0,
            f"pool_hard_below={self.pool_hard_below} and pool_easy_above={self.pool_easy_above} are pass rates with "
            "0 <= pool_hard_below < pool_easy_above <= 1.",
        )
        weights = self.pool_weights
        require(
            isinstance(weights, list)
            and len(weights) == 3
            and all(isinstance(w, (int, float)) and not isinstance(w, bool) and w > 0 for w in weights),
            f"pool_weights={weights!r} must be three weights > 0, [easy, normal, hard], e.g. [0.1, 0.8, 0.1].",
        )
        require(
            self.retire_after is None or self.retire_after >= 1,
            f"retire_after={self.retire_after} must be >= 1 (visits in a row), or null to never retire a prompt.",
        )
        require(
            self.retire_after is None or self.curriculum != "uniform",
            "retire_after needs a curriculum that weighs prompts (learnability, pools); uniform keeps the data order.",
        )
        require(0.0 < self.retire_revisit <= 1.0, f"retire_revisit={self.retire_revisit} must be in (0, 1].")
