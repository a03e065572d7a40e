"""One writer per run folder: an exclusive ``flock`` on ``RUN/.grpokit.lock`` while a run trains.

Two trainers on one output_dir would delete each other's store, metrics and checkpoints (overwrite, the stale
temporary-folder cleanup) and leave one run's results silently gone, so the second one is refused at once.
The kernel drops an flock when the process holding it dies (kill -9, the OOM killer), so a lock left by a dead
run is simply taken over; the file's text (PID, host, start time) only serves the message that refuses a second
writer. The file stays in the run folder (only a folder the lock itself created and nothing else was written to is
removed again). Readers (``grpokit inspect``, ``report``, ``eval``) never take the lock.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import socket
import sys
import time
from pathlib import Path

LOCK_FILE = ".grpokit.lock"
_HELD: dict[int, Path] = {}  # descriptor -> run folder (resolved) of the locks this process holds


def _close_held_in_child() -> None:
    """In a forked child: close the inherited lock descriptors (the lock stays the parent's, and ends with it)."""
    for fd in _HELD:
        with contextlib.suppress(OSError):
            os.close(fd)
    _HELD.clear()


os.register_at_fork(after_in_child=_close_held_in_child)


class RunFolderError(Exception):
    """A run folder that cannot be used as asked (another run writes it, or one of its files cannot be written),
    with what to do about it."""


def _try_lock(fd: int) -> bool:
    """True when this file description now holds the exclusive lock; False when another one holds it."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return False
        raise
    return True


def _holder_text(fd: int) -> str:
    """'PID 123 on host h (since 2025-01-01 12:00:00)', from the holder's line in the lock file."""
    os.lseek(fd, 0, os.SEEK_SET)
    fields = os.read(fd, 4096).decode(errors="replace").split()
    if len(fields) >= 2:
        since = f" (since {' '.join(fields[2:4])})" if len(fields) >= 4 else ""
        return f"PID {fields[0]} on host {fields[1]}{since}"
    return "another process (it has not written its PID yet)"


def _refusal(path: Path, holder: str) -> RunFolderError:
    return RunFolderError(
        f"output_dir {str(path)!r} is in use by another grpokit run ({holder}); wait for it to finish or stop it, "
        "or choose another output_dir."
    )


def check_unlocked(path: str | Path) -> None:
    """Refuse ``path`` when another live process holds its lock (the check before any model loads); takes nothing."""
    path = Path(path)
    if path.resolve() in _HELD.values():
        return  # this run's own lock (train() checks the folder again once it holds it)
    try:
        fd = os.open(path / LOCK_FILE, os.O_RDWR)
    except (FileNotFoundError, NotADirectoryError):
        return  # no run has trained here yet
    except OSError:
        return  # unreadable (read-only storage): train() reports what it cannot write
    try:
        if not _try_lock(fd):
            raise _refusal(path, _holder_text(fd))
    except OSError:
        return  # a filesystem without locks: train() says so
    finally:
        os.close(fd)  # closing the only descriptor of this open file also drops the probe's lock


def lock_holder(path: str | Path) -> str | None:
    """Who holds the lock of the run folder ``path`` ("PID 123 on host h (since ...)"), or None when no live process
    does (or the folder has no lock file, or it cannot be probed); takes nothing. Readers (`grpokit compare`) use it
    to say a run is still being written."""
    try:
        fd = os.open(Path(path) / LOCK_FILE, os.O_RDONLY)
    except OSError:
        return None
    try:
        return None if _try_lock(fd) else _holder_text(fd)
    except OSError:
        return None
    finally:
        os.close(fd)  # closing the only descriptor of this open file also drops the probe's lock


class RunLock:
    """The lock of one run folder, held by this process from :meth:`acquire` to :meth:`release`.

    Processes forked while it is held (reward workers) close their copy of the descriptor, so the lock ends
    with this process, not with its children."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._fd: int | None = None
        self._made = False  # acquire() created the folder

    def acquire(self) -> RunLock:
        """Create the folder if needed and take the lock; a second writer is refused with its PID and host.
        On a filesystem without flock (some network or FUSE mounts) the run goes on unlocked, saying so."""
        self._made = not self.path.exists()
        self.path.mkdir(parents=True, exist_ok=True)
        file = self.path / LOCK_FILE
        while True:
            fd = os.open(file, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                locked = _try_lock(fd)
            except OSError as exc:
                os.close(fd)
                print(
                    f"grpokit: warning: cannot lock {file} ({exc.strerror}); nothing stops a second run from "
                    "writing this output_dir at the same time",
                    file=sys.stderr,
                    flush=True,
                )
                return self
            if not locked:
                holder = _holder_text(fd)
                os.close(fd)
                raise _refusal(self.path, holder)
            if _same_file(fd, file):
                break
            os.close(fd)  # the holder deleted the file (see release) between our open and our lock: open it again
        os.ftruncate(fd, 0)
        line = f"{os.getpid()} {socket.gethostname()} {time.strftime('%Y-%m-%d %H:%M:%S')}\n"
        os.pwrite(fd, line.encode(), 0)
        self._fd = fd
        _HELD[fd] = self.path.resolve()
        return self

    def release(self) -> None:
        """Drop the lock; safe to call twice. The file stays, with the last holder's line, unless acquire() made the
        folder and nothing else was written there: then the folder goes too (a run refused before it wrote anything
        leaves no folder). Deleting the file is safe because acquire() checks that the file it locked is still the
        one at that path."""
        if self._fd is None:
            return
        _HELD.pop(self._fd, None)
        try:
            if self._made and [p.name for p in self.path.iterdir()] == [LOCK_FILE]:
                (self.path / LOCK_FILE).unlink()
                self.path.rmdir()
        except OSError:
            pass  # the folder stays: harmless
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


def _same_file(fd: int, path: Path) -> bool:
    try:
        return os.path.samestat(os.fstat(fd), os.stat(path))
    except FileNotFoundError:
        return False
