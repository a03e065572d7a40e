"""The metrics' settings (:mod:`grpokit.train.tracking`): keys of the ``run`` section, which is assembled from
this class; torch-free."""

from __future__ import annotations

from dataclasses import dataclass, field

from grpokit.errors import require

REPORT_SINKS = ("console", "jsonl", "tensorboard", "wandb", "mlflow", "trackio")


@dataclass
class TrackingSettings:
    """Where metrics and completions go, and how often."""

    report_to: list = field(default_factory=lambda: ["console", "jsonl"])
    """Metric sinks: console, jsonl, tensorboard, wandb, mlflow, trackio (the last two: optional extras)."""
    logging_steps: int = 10
    """Console line and log_history entry every this many steps, as TRL (jsonl and the store get every step)."""
    progress_bar: bool = True
    """Show a progress bar with live reward and KL (TRL's disable_tqdm=True sets it false)."""
    log_completions: bool = False
    """Print a table of prompts, completions and rewards every logging_steps, send it to W&B / trackio (with images
    under log_multimodal) and fill TRL's trainer._logs (all are stored anyway)."""
    num_completions_to_print: int | None = None
    """Rows of that table; null = all of the step's completions."""

    def check(self) -> None:
        require(self.logging_steps >= 1, f"logging_steps={self.logging_steps} must be >= 1.")
        require(
            self.num_completions_to_print is None or self.num_completions_to_print >= 1,
            f"num_completions_to_print={self.num_completions_to_print} must be >= 1 or null (= all).",
        )
        for sink in self.report_to:
            require(sink in REPORT_SINKS, f"report_to contains {sink!r}; valid sinks are {', '.join(REPORT_SINKS)}.")
