"""The loop's length and seed (:mod:`grpokit.train.loop`), and what stops it early (:mod:`grpokit.train.stopping`,
:mod:`grpokit.train.ties`): keys of the ``optim`` and ``run`` sections, which are assembled from these classes;
torch-free."""

from __future__ import annotations

from dataclasses import dataclass

from grpokit.errors import require


@dataclass
class LengthSettings:
    """How long the run trains, and its seed."""

    max_steps: int = -1
    """Steps to train (each: one generation batch, num_iterations x num_mini_batches optimizer steps); -1 (TRL's
    default) = num_train_epochs over train_dataset. A TRL script's GRPOConfig(num_iterations=..., max_steps=...) counts
    optimizer steps, as TRL, and is converted (docs/from_trl.md)."""
    num_train_epochs: float = 3.0
    """With max_steps -1: passes over train_dataset (steps = ceil(epochs x prompts // prompts per step), as TRL)."""
    seed: int = 42
    """Seed of data order, sampling and initialisation."""

    def check(self) -> None:
        require(
            self.max_steps >= 1 or self.max_steps == -1,
            f"max_steps={self.max_steps} must be >= 1, or -1 to train num_train_epochs.",
        )
        require(self.num_train_epochs > 0, f"num_train_epochs={self.num_train_epochs} must be > 0.")
        require(0 <= self.seed < 2**63, f"seed={self.seed} must be in [0, 2**63).")


@dataclass
class StopSettings:
    """The stop and warning rules of a run that goes wrong."""

    max_nonfinite_steps: int = 3
    """Stop after this many consecutive steps with a non-finite loss or gradient."""
    warn_tied_steps: int = 10
    """Warn when every group's completions tie (one reward per group: no advantage, nothing learned) this many steps
    in a row, naming the reward functions and their values; 0 = never."""

    def check(self) -> None:
        require(self.max_nonfinite_steps >= 1, f"max_nonfinite_steps={self.max_nonfinite_steps} must be >= 1.")
        require(self.warn_tied_steps >= 0, f"warn_tied_steps={self.warn_tied_steps} must be >= 0 (0 = never warn).")
