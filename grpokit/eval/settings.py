"""Evaluation's settings (:mod:`grpokit.eval.evaluator`): the ``eval`` section, assembled from this class;
torch-free."""

from __future__ import annotations

from dataclasses import dataclass, field

from grpokit.errors import require


@dataclass
class EvalSettings:
    """When and how the held-out set is evaluated (pass@k)."""

    eval_strategy: str = "steps"
    """steps (every eval_steps) | epoch (after each pass over train_dataset) | no; evaluation also runs before and after
    training."""
    eval_steps: int = 0
    """eval_strategy steps: evaluate every this many steps (and before and after training when > 0); 0 = off."""
    num_generations_eval: int = 8
    """Samples per eval prompt (n of pass@k)."""
    pass_at_k: list = field(default_factory=lambda: [1, 8])
    """k values reported as eval/pass@k (k <= num_generations_eval; left at [1, 8] with num_generations_eval n < 8 it
    becomes [1, n])."""
    eval_temperature: float | None = None
    """Sampling temperature for evaluation; defaults to temperature."""
    max_eval_prompts: int | None = None
    """Evaluate on at most this many prompts."""
    success_threshold: float = 1.0
    """A sample counts as correct for pass@k when its combined reward >= this."""
    eval_rewards: list | None = None
    """The rewards evaluation scores with (a list as `rewards:`, each weight 1); null = the training rewards.
    Distillation alone (`rewards: []` with a teacher) needs it for a held-out pass@k."""

    def check(self) -> None:
        require(
            self.eval_rewards is None or len(self.eval_rewards) > 0,
            "eval_rewards: [] scores nothing; list the rewards to evaluate with, or null (= the training rewards).",
        )
        require(self.eval_steps >= 0, f"eval_steps={self.eval_steps} must be >= 0 (0 = off).")
        require(self.num_generations_eval >= 1, f"num_generations_eval={self.num_generations_eval} must be >= 1.")
        require(
            self.eval_temperature is None or self.eval_temperature > 0,
            f"eval_temperature={self.eval_temperature} must be > 0 or null (= temperature).",
        )
        require(
            self.max_eval_prompts is None or self.max_eval_prompts >= 1,
            f"max_eval_prompts={self.max_eval_prompts} must be >= 1 or null (= all).",
        )
        for k in self.pass_at_k:
            require(
                isinstance(k, int) and 1 <= k <= self.num_generations_eval,
                f"pass_at_k contains {k!r}: each k must be an integer in [1, "
                f"num_generations_eval={self.num_generations_eval}].",
            )
