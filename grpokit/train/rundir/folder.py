"""The run folder: config.yaml guard, its lock and a previous run set aside (:class:`RunFolder`), what to resume
from, and what rank 0 writes there (store, trackers, report)."""

from __future__ import annotations

import errno
import json
import os
import sys
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

import yaml

from grpokit.errors import ConfigError
from grpokit.store import RolloutStore
from grpokit.store.integrity import EMPTY_CHAIN, next_chain
from grpokit.store.settings import StoreSettings
from grpokit.system.run_lock import RunFolderError, RunLock, check_unlocked
from grpokit.train.rundir import checkpoint, overwrite
from grpokit.train.rundir.resume import ResumePoint, check_run_files, find_checkpoint
from grpokit.train.tracking import Tracker

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


@dataclass(frozen=True)
class RunDirSpec:
    """What the run folder's code takes from the config, each field the config key of its name (filled by
    ``grpokit.compose.specs.part_settings``): the folder (``output_dir``), whether to resume (``resume_from``:
    latest | a checkpoint folder | None) or ``overwrite``, the trackers' settings (``report_to``, ``max_steps``,
    ``logging_steps``, ``progress_bar``, ``run_name``), the completions table (``log_completions``,
    ``num_completions_to_print``) and the store's images (``log_multimodal``, ``store_images_max_mb``); and two
    that are no key: the resolved ``config`` (its ``to_dict()``: written as config.yaml, compared with an existing
    run's, given to the trackers) and the ``notes`` atop config.yaml (how the compute dtype was chosen)."""

    output_dir: str
    resume_from: str | None
    overwrite: bool
    report_to: list
    max_steps: int
    logging_steps: int
    progress_bar: bool
    log_completions: bool
    num_completions_to_print: int | None
    log_multimodal: bool  # the store keeps the prompts' images (store/images.py), up to max_image_bytes
    run_name: str | None  # TRL's key, the W&B run's name
    store_images_max_mb: float | None
    config: dict = field(default_factory=dict)
    notes: tuple[str, ...] = ()

    @property
    def max_image_bytes(self) -> int | None:
        """``store_images_max_mb`` in bytes (None: no cap), as the store's settings count it."""
        return StoreSettings(store_images_max_mb=self.store_images_max_mb).max_image_bytes()

    def resuming(self, resume_from: str) -> RunDirSpec:
        """This spec resuming from ``resume_from`` (GRPOTrainer.train's ``resume_from_checkpoint``), in the
        config written to the folder too."""
        config = {**self.config, "run": {**self.config.get("run", {}), "resume_from": resume_from}}
        return replace(self, resume_from=resume_from, config=config)


def check_run_dir(spec: RunDirSpec, existing: bool = True) -> None:
    """Refuse an ``output_dir`` that cannot be a run folder, or (``existing``) holds another run unless resuming or
    overwriting (before any model loads). ``existing=False``: not that last check (a trainer being built, which
    ``train(resume_from_checkpoint=True)`` may yet be told to resume, as in TRL)."""
    _check_folder_path(Path(spec.output_dir))
    check_unlocked(spec.output_dir)  # another run writing here is refused before any model loads
    if spec.resume_from not in (None, "latest"):
        checkpoint.resolve_resume(spec.output_dir, spec.resume_from)  # raises when it is not a checkpoint folder
    run_dir = Path(spec.output_dir)
    config_file = run_dir / "config.yaml"
    if existing and spec.resume_from is None and not spec.overwrite and overwrite.holds_run(run_dir):
        old = (yaml.safe_load(config_file.read_text()) or {}) if config_file.is_file() else {}
        diff = _differences(old, spec.config) if old else []
        what = f"a run of a different config ({', '.join(diff[:3])})" if diff else "a run"
        raise ConfigError(
            f"output_dir {spec.output_dir!r} already holds {what}; set resume_from: latest to continue it "
            "(TRL: train(resume_from_checkpoint=True)), overwrite: true to replace it, or choose another output_dir."
        )


def resume_point(spec: RunDirSpec, check: bool = True) -> ResumePoint | None:
    """The checked checkpoint to resume from (``resume_from``: latest | a path), or None to start at step 0.
    ``check`` (rank 0, which owns the folder): first refuse an ``output_dir`` that cannot hold this run
    (:func:`check_run_dir`), and check the store and metrics.jsonl against the checkpoint (``rundir/resume.py``)."""
    if check:
        check_run_dir(spec)
    if spec.resume_from is None:
        return None
    point = find_checkpoint(spec.output_dir, spec.resume_from)
    if check and point is not None:
        check_run_files(Path(spec.output_dir), point, "jsonl" in spec.report_to)
        if point.note:
            print(f"grpokit: {point.note}", file=sys.stderr, flush=True)
    return point


class RunFolder:
    """Rank 0's hold on ``output_dir`` for one ``train()``: the folder's lock (one writer at a time) and, with
    ``overwrite``, the previous run moved aside until this one is durable (``train/rundir/overwrite.py``): its first
    checkpoint, or its final model when it saves none. :meth:`release` moves the previous run back if this one
    never got there, then drops the lock."""

    def __init__(self, spec: RunDirSpec):
        self.path = Path(spec.output_dir)
        self.lock = RunLock(self.path)
        self.previous: overwrite.SetAside | None = None
        self.lock.acquire()
        try:
            done = overwrite.recover(self.path)  # an overwrite a kill interrupted
        except BaseException:
            self.lock.release()
            raise
        if done and not spec.overwrite:
            print(f"grpokit: {done}", file=sys.stderr, flush=True)

    def set_aside(self) -> None:
        """Move the previous run's files into RUN/.overwritten (the start of an overwrite)."""
        self.previous = overwrite.set_aside(self.path)

    def durable(self) -> None:
        """This run has a checkpoint or its final model on disk: delete the previous run (once)."""
        if self.previous is not None:
            self.previous.discard()
            self.previous = None

    def release(self) -> None:
        try:
            if self.previous is not None:
                self.previous.restore()
                self.previous = None
        finally:
            self.lock.release()


def open_run_dir(spec: RunDirSpec, start: int, folder: RunFolder | None = None, point: ResumePoint | None = None):
    """Create or reopen ``output_dir`` (with overwrite, moving the previous run aside in ``folder``), write
    config.yaml, and open the store and the tracker (a :class:`RunLog`), dropping the steps after ``start`` (the step
    of ``point``, the checkpoint resumed from, checked by :func:`resume_point`; 0: everything, the evaluation before
    step 1 included). The trainer resumes before calling this, so a checkpoint that does not fit the model leaves the
    run folder as it was."""
    run_dir = Path(spec.output_dir)
    config_file = run_dir / "config.yaml"
    resuming = spec.resume_from is not None
    if not resuming and overwrite.holds_run(run_dir):
        if folder is None:
            raise RunFolderError(f"{run_dir} holds a run: overwriting it needs the folder's lock (a RunFolder)")
        folder.set_aside()
    run_dir.mkdir(parents=True, exist_ok=True)
    notes = "".join(f"# {line}\n" for line in spec.notes)
    _write_atomic(config_file, notes + yaml.safe_dump(spec.config, sort_keys=False))
    store = RolloutStore(
        run_dir / "rollouts.sqlite", run_id=run_dir.name, log_multimodal=spec.log_multimodal,
        max_image_bytes=spec.max_image_bytes,
    )  # fmt: skip
    store.rollback_after(start if start else -1)  # steps after the checkpoint are redone exactly once
    data, evals = spec.config.get("data") or {}, spec.config.get("eval") or {}  # each prompt's history: window, pass
    store.configure_prompt_history(int(data.get("history_window", 16)), float(evals.get("success_threshold", 1.0)))
    _truncate_metrics(run_dir / "metrics.jsonl", start)
    if point is not None and point.chain is not None:
        first, chain = point.first, point.chain
    else:  # a new store (from step 1), or one a checkpoint of another folder starts after its step
        first, chain = start + 1, EMPTY_CHAIN
    tracker = Tracker(
        run_dir,
        list(spec.report_to),
        spec.config,
        spec.max_steps,
        spec.logging_steps,
        spec.progress_bar,
        run_name=spec.run_name,
        start_step=start,
    )  # run_name: TRL's key, the W&B run's name
    return RunLog(spec, run_dir, store, tracker, first, chain)


class RunLog:
    """What rank 0 writes to an open run folder while the run goes: each step's rollout records and metrics (the
    store, one transaction, then the trackers), evaluations, the closing summary; ``close()`` writes report.html."""

    def __init__(
        self,
        spec: RunDirSpec,
        path: Path,
        store: RolloutStore,
        tracker: Tracker,
        first: int = 1,
        chain: str = EMPTY_CHAIN,
    ):
        self.spec, self.path, self.store, self.tracker = spec, path, store, tracker
        self.first, self.chain = first, chain  # the digest chain of the store's steps first.. (store/integrity.py)

    def step(self, step: int, records: list, metrics: dict) -> None:
        self.store.write_step(step, records, metrics)
        self.chain = next_chain(self.chain, self.store.step_digest(step))
        with self._writing_metrics():
            self.tracker.log(metrics, step)
        if self.spec.log_completions and step % self.spec.logging_steps == 0:
            self.tracker.log_completions(records, step, self.spec.num_completions_to_print, self.spec.log_multimodal)

    def evaluation(self, step: int, metrics: dict, dataset: str = "eval", prompts: list | None = None) -> None:
        """An evaluation of the eval set ``dataset`` ("eval": the one eval_dataset; else a name of a dict of them);
        ``prompts``: each prompt's result (``Evaluation.per_prompt``), kept for the report's held-out view."""
        self.store.write_eval(step, dataset, metrics, prompts)
        with self._writing_metrics():
            self.tracker.log_eval(metrics, step)

    def seal(self) -> dict:
        """Flush the store and metrics.jsonl to disk and return what a checkpoint records of them: the store's last
        step and digest chain, metrics.jsonl's length and SHA-256 (None without the jsonl sink)."""
        self.store.sync()
        with self._writing_metrics():
            metrics = self.tracker.metrics_file()
        store = {"first": self.first, "steps": self.store.last_step(), "chain": self.chain}
        return {"store": store, "metrics": metrics}

    @contextmanager
    def _writing_metrics(self):
        """A failed write of metrics.jsonl (a full disk) as one line naming the file; the store holds the step."""
        try:
            yield
        except OSError as exc:
            raise RunFolderError(
                f"cannot write {self.path / 'metrics.jsonl'}: {exc.strerror} ({errno.errorcode.get(exc.errno, '?')}); "
                "the checkpoints are intact: fix that, then resume with resume_from=latest."
            ) from None

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
    """Drop metric lines of steps after ``step`` (they are about to be redone; ``step`` 0: every line, the
    evaluation before step 1 included), and a line torn by a kill mid-write. The file is replaced atomically, so a
    kill here cannot lose the earlier steps."""
    if not path.exists():
        return
    kept = [
        line
        for line in path.read_text().splitlines()
        if step and (record := _json_line(line)) is not None and record.get("step", 0) <= step
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
