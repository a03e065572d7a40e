"""What a resume starts from, checked: the checkpoint against its manifest, the store and metrics.jsonl against what
the checkpoint recorded of them. Nothing is written until all three passed, so a damaged file is refused with one
line naming it and the run folder stays as it was. ``resume_from: latest`` skips damaged checkpoints for the newest
intact one, and says so.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from grpokit.store.integrity import check_store
from grpokit.system.run_lock import RunFolderError
from grpokit.train.rundir.checkpoint import CheckpointError, list_checkpoints, verify_checkpoint

RESTART = "start the run again with overwrite: true"


@dataclass
class ResumePoint:
    """A checked checkpoint folder: its ``step``, its ``manifest``, a ``note`` to print when newer checkpoints were
    damaged, and (rank 0, after :func:`check_run_files`) the store's verified digest ``chain`` of its steps
    ``first``..``step`` (None: a checkpoint of another folder starts this folder's store)."""

    path: Path
    step: int
    manifest: dict
    note: str | None = None
    first: int = 1
    chain: str | None = None


def find_checkpoint(run_dir: str | Path, resume_from: str) -> ResumePoint | None:
    """The checkpoint to resume from: ``latest`` (the newest intact one of ``run_dir``; None when there is none at
    all) or a folder. A damaged folder given by path, or no intact one at all, is a CheckpointError."""
    if resume_from != "latest":
        try:
            return _checked(Path(resume_from))
        except CheckpointError as exc:
            raise CheckpointError(
                f"{exc}; resume from another checkpoint (resume_from=latest picks the newest intact one)."
            ) from None
    found = list_checkpoints(run_dir)
    damaged = []
    for path in reversed(found):
        try:
            point = _checked(path)
        except CheckpointError as exc:
            damaged.append(str(exc))
            continue
        if damaged:
            skipped = f" ({len(damaged)} damaged checkpoints newer than it)" if len(damaged) > 1 else ""
            point.note = f"{damaged[0]}; resuming from {path.name}, the newest intact checkpoint{skipped}"
        return point
    if not found:
        return None
    more = f" (and {len(found) - 1} older, all damaged)" if len(found) > 1 else ""
    raise CheckpointError(f"no intact checkpoint to resume from: {damaged[0]}{more}; restore it, or {RESTART}.")


def _checked(path: Path) -> ResumePoint:
    manifest = verify_checkpoint(path)
    try:
        step = int(json.loads((path / "trainer_state.json").read_text())["step"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"{path}: trainer_state.json is missing or corrupt ({exc})") from None
    return ResumePoint(path, step, manifest)


def check_run_files(run_dir: Path, point: ResumePoint, writes_metrics: bool) -> None:
    """Check the store (and metrics.jsonl, when the run writes it) against ``point``'s record, and set ``point``'s
    ``first`` and ``chain``. A checkpoint of another folder resumed into a folder without a store is left unchecked:
    it starts that folder's store at its step."""
    record = point.manifest.get("run") or {}
    store = run_dir / "rollouts.sqlite"
    own = point.path.resolve().parent == (run_dir / "checkpoints").resolve()
    if not own and not store.exists():
        return
    if writes_metrics and record.get("metrics") is not None:  # first: it reads, the store check may replay a WAL
        check_metrics(run_dir / "metrics.jsonl", record["metrics"], point.path.name)
    stored = record.get("store") or {}
    point.first = int(stored.get("first", 1))
    point.chain = check_store(store, point.first, point.step, stored.get("chain"), point.path.name)


def check_metrics(path: Path, recorded: dict, checkpoint: str) -> None:
    """The first ``recorded['bytes']`` bytes of metrics.jsonl must be what checkpoint ``checkpoint`` saw (lines after
    them belong to steps the resume redoes)."""
    want, fix = int(recorded["bytes"]), f"restore the file from a copy, or {RESTART}"
    if not path.is_file():
        raise RunFolderError(f"{path} is missing, but checkpoint {checkpoint} recorded {want} bytes of it; {fix}.")
    size = path.stat().st_size
    if size < want:
        what = "empty (0 bytes)" if size == 0 else f"truncated ({size} bytes)"
        raise RunFolderError(f"{path} is {what}, but checkpoint {checkpoint} recorded {want} bytes of it; {fix}.")
    digest, left = hashlib.sha256(), want
    with open(path, "rb") as f:
        while left and (chunk := f.read(min(left, 1 << 20))):
            digest.update(chunk)
            left -= len(chunk)
    if digest.hexdigest() != recorded["sha256"]:
        raise RunFolderError(
            f"{path} does not match what checkpoint {checkpoint} recorded of it (its SHA-256 differs: the file is "
            f"corrupted); {fix}."
        )
