"""The run folder: config.yaml guard, what to resume from, and what rank 0 writes there (store, trackers, report)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import yaml

from grpokit.config import ConfigError
from grpokit.store import RolloutStore
from grpokit.tracking import Tracker
from grpokit.train import checkpoint

# Keys that may differ between a run and its resumption without making it another run.
RESUME_FREE_KEYS = {
    "resume_from",
    "overwrite",
    "max_steps",
    "progress_bar",
    "report_to",
    "logging_steps",
    "save_steps",
    "save_total_limit",
}


def check_run_dir(args, existing: bool = True) -> None:
    """Refuse an ``output_dir`` that cannot be a run folder, or (``existing``) holds another run unless resuming or
    overwriting. ``existing=False``: the path only (a trainer being built, which ``train()`` may yet be told to
    resume)."""
    _check_folder_path(Path(args.output_dir))
    if args.resume_from not in (None, "latest"):
        checkpoint.resolve_resume(args.output_dir, args.resume_from)  # raises when it is not a checkpoint folder
    config_file = Path(args.output_dir) / "config.yaml"
    if existing and config_file.exists() and args.resume_from is None and not args.overwrite:
        old = yaml.safe_load(config_file.read_text()) or {}
        diff = _differences(old, args.to_dict())
        what = f"a run of a different config ({', '.join(diff[:3])})" if diff else "a run"
        raise ConfigError(
            f"output_dir {args.output_dir!r} already holds {what}; set resume_from: latest to continue it "
            "(TRL: train(resume_from_checkpoint=True)), overwrite: true to replace it, or choose another output_dir."
        )


def resume_point(args, check: bool = True) -> Path | None:
    """The checkpoint folder to resume from (``resume_from``: latest | a path), or None to start at step 0.
    ``check``: first refuse an ``output_dir`` that cannot hold this run (:func:`check_run_dir`; rank 0)."""
    if check:
        check_run_dir(args)
    return None if args.resume_from is None else checkpoint.resolve_resume(args.output_dir, args.resume_from)


def open_run_dir(args, start: int):
    """Create or reopen ``output_dir`` (clearing it when overwriting), write config.yaml, and open the store
    and the tracker (a :class:`RunLog`), dropping the steps after ``start`` (the step resumed from, or 0). The
    trainer resumes before calling this, so a checkpoint that does not fit the model leaves the run folder as it was."""
    run_dir = Path(args.output_dir)
    config_file = run_dir / "config.yaml"
    resuming = args.resume_from is not None
    if config_file.exists() and not resuming:
        for name in ("rollouts.sqlite", "rollouts.sqlite-wal", "rollouts.sqlite-shm", "metrics.jsonl", "report.html"):
            (run_dir / name).unlink(missing_ok=True)
        for name in ("checkpoints", "final"):
            shutil.rmtree(run_dir / name, ignore_errors=True)
    run_dir.mkdir(parents=True, exist_ok=True)
    _write_atomic(config_file, args.to_yaml())
    store = RolloutStore(run_dir / "rollouts.sqlite", run_id=run_dir.name)
    store.rollback_after(start)  # steps after the checkpoint are redone exactly once
    _truncate_metrics(run_dir / "metrics.jsonl", start)
    tracker = Tracker(
        run_dir,
        args.report_to,
        args.to_dict(),
        args.max_steps,
        args.logging_steps,
        args.progress_bar,
        run_name=args.run_name,
        start_step=start,
    )  # run_name: TRL's key, the W&B run's name
    return RunLog(args, run_dir, store, tracker)


class RunLog:
    """What rank 0 writes to an open run folder while the run goes: each step's rollout records and metrics (the
    store, one transaction, then the trackers), evaluations, the closing summary; ``close()`` writes report.html."""

    def __init__(self, args, path: Path, store: RolloutStore, tracker: Tracker):
        self.args, self.path, self.store, self.tracker = args, path, store, tracker

    def step(self, step: int, records: list, metrics: dict) -> None:
        self.store.write_step(step, records, metrics)
        self.tracker.log(metrics, step)
        if self.args.log_completions and step % self.args.logging_steps == 0:
            self.tracker.log_completions(records, step, self.args.num_completions_to_print)

    def evaluation(self, step: int, metrics: dict, dataset: str = "eval") -> None:
        """An evaluation of the eval set ``dataset`` ("eval": the one eval_dataset; else a name of a dict of them)."""
        self.store.write_eval(step, dataset, metrics)
        self.tracker.log_eval(metrics, step)

    def summary(self, step: int, summary: dict, metrics: dict) -> None:
        """The closing summary line: ``summary`` (train_summary) and the last step's ``metrics``."""
        self.tracker.summary(step, summary, metrics)

    def warn(self, text: str) -> None:
        self.tracker.console.print(f"[yellow]{text}[/yellow]", soft_wrap=True)  # one line, however narrow

    def close(self) -> None:
        """Close the trackers, write report.html, close the store."""
        self.tracker.close()
        from grpokit.store.report import write_report

        try:
            write_report(self.path)
        except Exception as exc:  # a report must never cost the run its results
            self.tracker.console.print(f"[yellow]could not write report.html: {exc}[/yellow]")
        self.store.close()


def _check_folder_path(path: Path) -> None:
    """``path`` is a folder, or can be made one: no part of it is a regular file, and the first
    existing ancestor is writable."""
    for part in (path, *path.parents):
        if part.exists():
            if not part.is_dir():
                what = "is a file" if part == path else f"is below {str(part)!r}, which is a file"
                raise ConfigError(f"output_dir {str(path)!r} {what}, not a folder; choose another output_dir.")
            if not os.access(part, os.W_OK | os.X_OK):
                raise ConfigError(
                    f"output_dir {str(path)!r} cannot be written: no write permission on {str(part)!r}; "
                    "choose another output_dir."
                )
            return


def _differences(old: dict, new: dict) -> list[str]:
    out = []
    for section, values in new.items():
        if not isinstance(values, dict):
            if old.get(section) != values:
                out.append(section)
            continue
        for key, value in values.items():
            if key not in RESUME_FREE_KEYS and (old.get(section) or {}).get(key) != value:
                out.append(f"{section}.{key}")
    return out


def _truncate_metrics(path: Path, step: int) -> None:
    """Drop metric lines of steps after ``step`` (they are about to be redone), and a line torn by a
    kill mid-write. The file is replaced atomically, so a kill here cannot lose the earlier steps."""
    if not path.exists():
        return
    kept = [
        line
        for line in path.read_text().splitlines()
        if (record := _json_line(line)) is not None and record.get("step", 0) <= step
    ]
    _write_atomic(path, "".join(line + "\n" for line in kept))


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _json_line(line: str) -> dict | None:
    try:
        record = json.loads(line)
    except json.JSONDecodeError:
        return None
    return record if isinstance(record, dict) else None
