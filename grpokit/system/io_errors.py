"""One line for a file the storage would not read or write: the path and the cause.

A full disk (ENOSPC), a read-only file system (EROFS), a failing device or a lost network mount (EIO), a folder
without permission (EACCES): none of these is a bug in grpokit, so the CLI prints :func:`storage_error_line`'s
line instead of a traceback. An ``OSError`` names its file only when it came from opening it; a failed
``write()`` on an open file (how a full disk shows) does not, so the path is then taken from the failing frame:
the open file object or the path it was writing. SQLite reports the same causes as its own errors
("database or disk is full", "attempt to write a readonly database", "disk I/O error").

Imports nothing from grpokit, so any layer may use it.
"""

from __future__ import annotations

import errno
import io
import os
import sqlite3
from types import TracebackType

# The storage's errors, with what the user can do about each.
HINTS = {
    errno.ENOSPC: "free some space there, or write to another folder",
    errno.EDQUOT: "free some of your quota there, or write to another folder",
    errno.EROFS: "the file system is read-only; write to another folder",
    errno.EIO: "the device or network mount failed; check the storage (dmesg), then retry",
    errno.EACCES: "no permission there; change the folder's permissions or write to another folder",
    errno.EPERM: "no permission there; change the folder's permissions or write to another folder",
    errno.EFBIG: "the file grew past the file system's size limit; write to another folder",
}
# SQLite's words for the same causes (its messages carry no path).
_SQLITE_CAUSES = {
    "database or disk is full": errno.ENOSPC,
    "attempt to write a readonly database": errno.EROFS,
    "disk i/o error": errno.EIO,
}


def storage_errno(exc: BaseException) -> int | None:
    """The errno of ``exc`` when it is (or was caused by) the storage failing (see :data:`HINTS`), else None."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in HINTS:
            return exc.errno
        if isinstance(exc, sqlite3.OperationalError):
            cause = _SQLITE_CAUSES.get(str(exc).strip().lower())
            if cause is not None:
                return cause
        exc = exc.__cause__ or exc.__context__
    return None


def storage_error_line(exc: BaseException) -> str | None:
    """``"PATH: cause; what to do"`` for an error of the storage (:func:`storage_errno`), else None."""
    code = storage_errno(exc)
    if code is None:
        return None
    failing = _failing(exc, code)
    path = failing_path(failing)
    cause = os.strerror(code)
    where = f"{path}: " if path else ""
    return f"{where}{cause} ({errno.errorcode.get(code, code)}); {HINTS[code]}"


def _failing(exc: BaseException, code: int) -> BaseException:
    """The exception in ``exc``'s chain that carries the storage error ``code``."""
    while exc is not None:
        if isinstance(exc, OSError) and exc.errno == code:
            return exc
        if isinstance(exc, sqlite3.OperationalError) and _SQLITE_CAUSES.get(str(exc).strip().lower()) == code:
            return exc
        exc = exc.__cause__ or exc.__context__
    raise AssertionError("storage_errno found no such exception")


def failing_path(exc: BaseException) -> str | None:
    """The file ``exc`` is about: its ``filename``, else the innermost frame's open file or path (an open file's
    failed write, SQLite's errors: see the module docstring), else None."""
    for name in (getattr(exc, "filename", None), getattr(exc, "filename2", None)):
        if isinstance(name, (str, bytes, os.PathLike)):
            return os.fsdecode(name)
    return _path_in_frames(exc.__traceback__)


def _path_in_frames(tb: TracebackType | None) -> str | None:
    frames = []
    while tb is not None:
        frames.append(tb.tb_frame)
        tb = tb.tb_next
    for frame in reversed(frames):  # innermost first
        for value in frame.f_locals.values():
            path = _path_of(value)
            if path is not None:
                return path
    return None


def _path_of(value) -> str | None:
    if isinstance(value, io.IOBase) and isinstance(getattr(value, "name", None), str):
        return value.name
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    path = getattr(value, "path", None)  # an object writing one file (the rollout store)
    if isinstance(path, os.PathLike) and not isinstance(value, type):
        return os.fspath(path)
    return None


def write_stdout(text: str) -> None:
    """Write ``text`` to stdout and flush it now, so a failed write (stdout redirected to a full disk) is raised
    here, naming standard output, and not at the interpreter's exit, where it would be a warning and exit 120. A
    closed pipe (``| head``) raises BrokenPipeError as it is."""
    import sys

    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:
        raise
    except OSError as exc:
        if exc.errno is None or exc.filename is not None:
            raise
        raise type(exc)(exc.errno, exc.strerror, "<standard output>") from exc
