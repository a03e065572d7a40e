"""The run folder's and checkpoints' settings (:mod:`grpokit.train.rundir`): keys of the ``run`` section, which is
assembled from these classes; torch-free."""

from __future__ import annotations

from dataclasses import dataclass

from grpokit.errors import require


@dataclass
class RunFolderSettings:
    """Where the run is written, and what happens to a run already there."""

    output_dir: str = "runs/grpo"
    """Run folder: config.yaml, metrics.jsonl, rollouts.sqlite, checkpoints/, report.html."""
    resume_from: str | None = None
    """latest (the newest intact checkpoint) | a checkpoint folder; continues the same run exactly."""
    overwrite: bool = False
    """Replace a run in output_dir: its config.yaml, rollouts.sqlite, metrics.jsonl, report.html, checkpoints/,
    final/ and tensorboard/ are moved to output_dir/.overwritten, deleted once the new run has its first checkpoint
    (or final model), and put back if it stops before."""


@dataclass
class CheckpointSettings:
    """When checkpoints are written, and how many are kept."""

    save_strategy: str = "steps"
    """steps (every save_steps and at the end) | epoch (after each pass over train_dataset and at the end) | no (none,
    except on a signal)."""
    save_steps: int = 50
    """save_strategy steps: checkpoint every this many steps (and at the end); 0 = only at the end."""
    save_total_limit: int | None = 2
    """Keep at most this many step checkpoints; null = all."""

    def check(self) -> None:
        require(self.save_steps >= 0, f"save_steps={self.save_steps} must be >= 0 (0 = only at the end).")
        require(
            self.save_total_limit is None or self.save_total_limit >= 1,
            f"save_total_limit={self.save_total_limit} must be >= 1 or null.",
        )
