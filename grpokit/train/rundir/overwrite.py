"""``overwrite: true`` without losing the previous run before the new one is durable.

The previous run's files are moved (renamed, same filesystem) into ``RUN/.overwritten/`` when the new run opens the
folder, and deleted only once the new run has written its first checkpoint (or, saving none, its final model). Until
then any end of the new run (an error, a signal) moves them back; a kill -9 in between is undone by the next run on
that folder (:func:`recover`, under the folder's lock), which keeps whichever of the two runs is durable. The list of
names moved aside is written first (``moved.json``), so moving them back is safe to repeat after a kill at any point;
a marker (``complete``) exists only between the end of the moves and the start of a restore, which is when the folder's
checkpoints and final model can only be the new run's.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from grpokit.train.rundir.checkpoint import fsync_dir, list_checkpoints

# What overwrite replaces: the files a run writes in its folder (anything else there is left alone).
RUN_FILES = (
    "config.yaml",
    "rollouts.sqlite",
    "rollouts.sqlite-wal",
    "rollouts.sqlite-shm",
    "metrics.jsonl",
    "report.html",
    "checkpoints",
    "final",
    "tensorboard",
)
ASIDE = ".overwritten"
DELETING = ".overwritten-deleting"
MOVED = "moved.json"
COMPLETE = "complete"


def holds_run(run_dir: Path) -> bool:
    """Whether ``run_dir`` holds a run: its config, store, a checkpoint or a final model (an empty checkpoints/
    folder, say a mount point made ready for the run, is not one)."""
    files = ("config.yaml", "rollouts.sqlite", "final")
    return any((run_dir / name).exists() for name in files) or bool(list_checkpoints(run_dir))


def set_aside(run_dir: Path) -> SetAside:
    """Move the previous run's files into ``RUN/.overwritten`` (none there: nothing moves, nothing to restore)."""
    aside = run_dir / ASIDE
    aside.mkdir()
    moved = [name for name in RUN_FILES if (run_dir / name).exists()]
    _write_synced(aside / MOVED, json.dumps(moved))
    for name in moved:
        os.replace(run_dir / name, aside / name)
    fsync_dir(run_dir)
    _write_synced(aside / COMPLETE, "")
    fsync_dir(aside)
    return SetAside(run_dir)


class SetAside:
    """A previous run moved aside: :meth:`discard` deletes it (the new run is durable), :meth:`restore` puts it
    back in place of the new run's files."""

    def __init__(self, run_dir: Path):
        self.run_dir = run_dir
        self.aside = run_dir / ASIDE

    def discard(self) -> None:
        """Delete the previous run: renamed first, so a kill midway never leaves a half-deleted run to restore."""
        os.replace(self.aside, self.run_dir / DELETING)
        fsync_dir(self.run_dir)
        shutil.rmtree(self.run_dir / DELETING, ignore_errors=True)

    def restore(self) -> None:
        """Delete the new run's files and move the previous run's back; repeatable after a kill midway."""
        moved = json.loads((self.aside / MOVED).read_text())
        if (self.aside / COMPLETE).exists():  # from here on, the folder's checkpoints may be the previous run's
            (self.aside / COMPLETE).unlink()
            fsync_dir(self.aside)
        for name in RUN_FILES:
            if name in moved and not (self.aside / name).exists():
                continue  # moved back already (a restore killed midway)
            _remove(self.run_dir / name)
            if name in moved:
                os.replace(self.aside / name, self.run_dir / name)
        fsync_dir(self.run_dir)
        shutil.rmtree(self.aside)


def recover(run_dir: Path) -> str | None:
    """Finish an overwrite a kill interrupted (call with the folder's lock held). The new run is kept when it is
    durable (a checkpoint or a final model), else the previous run is put back. Returns what was done, or None."""
    shutil.rmtree(run_dir / DELETING, ignore_errors=True)
    if not (run_dir / ASIDE).is_dir():
        return None
    pending = SetAside(run_dir)
    if not (run_dir / ASIDE / MOVED).is_file():  # killed before anything moved
        shutil.rmtree(pending.aside)
        return None
    complete = (run_dir / ASIDE / COMPLETE).exists()  # the moves were done and no restore began
    if complete and (list_checkpoints(run_dir) or (run_dir / "final").is_dir()):
        pending.discard()
        return None  # what the overwrite would have done had it not been killed
    pending.restore()
    return (
        f"restored the previous run in {run_dir}: the run that was overwriting it stopped before its first checkpoint"
    )


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


def _write_synced(path: Path, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
