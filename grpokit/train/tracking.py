"""Metric sinks: console (rich, with a progress bar), metrics.jsonl, TensorBoard, W&B, and MLflow and trackio
(train/tracking_sinks.py).

The console shows the same thing from the CLI and from ``trainer.train()`` in Python: a live bar
(step, reward, KL, seconds per step, elapsed and remaining time; ``progress_bar``, TRL's
``disable_tqdm``), a line of metrics every ``logging_steps`` and a summary line at the end.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from pathlib import Path

from grpokit.algos.names import KL
from grpokit.store.record import RolloutRecord

EVAL_CONSOLE = ("reward", "greedy_accuracy", "num_prompts")  # and every pass@k
CONSOLE_KEYS = ("reward", "reward_std", KL, "loss", "entropy", "completion_length/mean", "grad_norm", "step_time")


class HashedAppend:
    """A file held open for appending lines (metrics.jsonl) that knows the length and SHA-256 of its whole content,
    so a checkpoint can record them (``record``) and a resume can tell a truncated or changed file."""

    def __init__(self, path: Path):
        self.path = path
        self._digest, self.bytes = hashlib.sha256(), 0
        if path.exists():
            with open(path, "rb") as f:
                while chunk := f.read(1 << 20):
                    self._digest.update(chunk)
                    self.bytes += len(chunk)
        self._file = open(path, "ab")  # noqa: SIM115 (held open for the run, closed in close())

    def write(self, text: str) -> None:
        data = text.encode()
        self._file.write(data)
        self._file.flush()
        self._digest.update(data)
        self.bytes += len(data)

    def sync(self) -> None:
        """Flush to disk (fsync)."""
        self._file.flush()
        os.fsync(self._file.fileno())

    def record(self) -> dict:
        return {"bytes": self.bytes, "sha256": self._digest.hexdigest()}

    def close(self) -> None:
        self._file.close()


class Tracker:
    def __init__(
        self,
        run_dir: str | Path,
        report_to: list[str],
        config: dict,
        max_steps: int,
        logging_steps: int = 1,
        progress_bar: bool = True,
        run_name: str | None = None,
        start_step: int = 0,
    ):
        from rich.console import Console

        self.run_dir = Path(run_dir)
        self.sinks = set(report_to)
        self.logging_steps = logging_steps
        self.console = Console(stderr=True)
        # held open for the run, closed in close()
        self._jsonl = HashedAppend(self.run_dir / "metrics.jsonl") if "jsonl" in self.sinks else None
        self._tb = None
        self._wandb = None
        if "tensorboard" in self.sinks:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                raise ImportError(
                    "report_to includes tensorboard but it is not installed: pip install 'grpokit[tensorboard]'."
                ) from None
            self._tb = SummaryWriter(log_dir=str(self.run_dir / "tensorboard"))
        if "wandb" in self.sinks:
            try:
                import wandb
            except ImportError:
                raise ImportError(
                    "report_to includes wandb but it is not installed: pip install 'grpokit[wandb]'."
                ) from None
            self._wandb = wandb.init(
                project=os.environ.get("WANDB_PROJECT") or "grpokit",  # an explicit project would override the env
                name=run_name or self.run_dir.name,
                dir=str(self.run_dir),
                config=config,
                resume="allow",
            )
        from grpokit.train.tracking_sinks import optional_sinks

        self._others = optional_sinks(self.sinks, self.run_dir, config, run_name or self.run_dir.name)  # mlflow ...
        self._progress = None
        if progress_bar:
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )

            self._progress = Progress(
                TextColumn("[bold]grpo"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TextColumn("<"),
                TimeRemainingColumn(),
                TextColumn("{task.description}"),
                console=self.console,
                transient=True,
            )
            self._task = self._progress.add_task("", total=max_steps, completed=start_step)
            self._progress.start()

    def log(self, metrics: dict, step: int) -> None:
        clean = {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float)) and math.isfinite(float(v))}
        if self._jsonl is not None:
            self._jsonl.write(json.dumps({"step": step, **clean}) + "\n")
        if self._tb is not None:
            for k, v in clean.items():
                self._tb.add_scalar(k, v, step)
        if self._wandb is not None:
            self._wandb.log(clean, step=step)
        for sink in self._others:
            sink.log(clean, step)
        if self._progress is not None and "reward" in clean:
            desc = f"reward {clean['reward']:.3f}" + (f"  kl {clean[KL]:.4f}" if KL in clean else "")
            desc += f"  {clean['step_time']:.1f}s/step" if "step_time" in clean else ""
            self._progress.update(self._task, completed=step, description=desc)
        if "console" in self.sinks and step % self.logging_steps == 0 and "reward" in clean:
            parts = [f"{k}={clean[k]:.4g}" for k in CONSOLE_KEYS if k in clean]
            self.console.print(f"step {step}: " + "  ".join(parts), soft_wrap=True)  # one line per step, greppable

    def metrics_file(self) -> dict | None:
        """metrics.jsonl's length and SHA-256 after an fsync (None: the run writes no metrics.jsonl)."""
        if self._jsonl is None:
            return None
        self._jsonl.sync()
        return self._jsonl.record()

    def log_eval(self, metrics: dict, step: int) -> None:
        """Every metric to the sinks; on the console the headline ones (reward, pass@k, greedy accuracy, prompts)."""
        self.log(metrics, step)
        if "console" in self.sinks:
            shown = {k: v for k, v in metrics.items() if k.rpartition("/")[2] in EVAL_CONSOLE or "/pass@" in k}
            line = f"eval @ step {step}: " + "  ".join(f"{k}={v:.4g}" for k, v in shown.items())
            self.console.print(line, soft_wrap=True)  # one line, however narrow (rich wraps at 80 when piped)

    def log_completions(
        self, records: list[RolloutRecord], step: int, limit: int | None = None, images: bool = False
    ) -> None:
        """TRL's ``log_completions``: a table of the step's prompts (each image as ``[image <hash> <w>x<h>]``),
        completions, rewards and advantages on the console (the first ``limit`` rows), and the whole table to W&B
        and trackio (``images``: log_multimodal, an image column of each prompt's images;
        train/completions_table.py)."""
        from rich.table import Table
        from rich.text import Text

        from grpokit.train.completions_table import console_prompt

        if self._wandb is not None or any(hasattr(sink, "log_table") for sink in self._others):
            self._log_table(records, step, images)

        table = Table(title=f"completions at step {step}", show_lines=True)
        for column in ("prompt", "completion", "reward", "advantage"):
            table.add_column(column)
        for record in records[:limit]:  # Text: a prompt's brackets ([image ...]) are not rich markup
            reward, advantage = ("-" if v is None else f"{v:.3f}" for v in (record.reward, record.advantage))
            table.add_row(Text(console_prompt(record)), Text(record.completion), reward, advantage)
        self.console.print(table)

    def _log_table(self, records: list[RolloutRecord], step: int, images: bool) -> None:
        from grpokit.train.completions_table import TABLE_KEY, completion_table, tracker_table

        columns, rows = completion_table(records, step, images)
        if self._wandb is not None:
            import wandb

            self._wandb.log({TABLE_KEY: tracker_table(wandb, columns, rows, image_lists=False)}, step=step)
        for sink in self._others:
            if hasattr(sink, "log_table"):
                sink.log_table(columns, rows, step)

    def summary(self, steps: int, summary: dict, metrics: dict) -> None:
        """The closing line: steps, time and the last step's reward and KL."""
        if "console" not in self.sinks and self._progress is None:
            return
        parts = [f"{steps} steps in {summary['train_runtime']:.1f}s", f"train_loss={summary['train_loss']:.4g}"]
        parts += [f"{k}={metrics[k]:.4g}" for k in ("reward", KL) if k in metrics]
        self.console.print("done: " + "  ".join(parts), soft_wrap=True)

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
        if self._jsonl is not None:
            self._jsonl.close()
            self._jsonl = None
        if self._tb is not None:
            self._tb.close()
            self._tb = None
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None
        for sink in self._others:
            sink.close()
        self._others = []
