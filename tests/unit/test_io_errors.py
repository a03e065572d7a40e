"""grpokit/system/io_errors.py: a storage error as one line, the path and the cause, however the error names it."""

import errno
import os
import sqlite3
from pathlib import Path

import pytest

from grpokit.system.io_errors import storage_errno, storage_error_line


def failed_write(path: Path) -> OSError:
    """The error of a write() on an open file, as a full disk raises it: an errno and no filename."""

    def write_report(target: Path) -> None:
        with open(target, "w") as out:
            out.flush()
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    try:
        write_report(path)
    except OSError as exc:
        return exc
    raise AssertionError("no error")


def test_an_error_with_its_filename():
    exc = PermissionError(errno.EACCES, "Permission denied", "/runs/a/report.html")
    assert storage_error_line(exc) == (
        "/runs/a/report.html: Permission denied (EACCES); no permission there; change the folder's permissions or "
        "write to another folder"
    )


def test_a_failed_write_names_the_open_file(tmp_path):
    """No filename on the error: the file open in the failing frame is named."""
    line = storage_error_line(failed_write(tmp_path / "metrics.jsonl"))
    assert (
        line == f"{tmp_path / 'metrics.jsonl'}: No space left on device (ENOSPC); free some space there, or "
        "write to another folder"
    )


def test_a_cause_in_the_chain_and_sqlites_words(tmp_path):
    """A storage error wrapped by another (raise ... from) is found; SQLite's "database or disk is full" is ENOSPC."""
    try:
        try:
            raise OSError(errno.EIO, os.strerror(errno.EIO), str(tmp_path / "x"))
        except OSError as inner:
            raise RuntimeError("could not save") from inner
    except RuntimeError as outer:
        assert storage_errno(outer) == errno.EIO
        assert storage_error_line(outer).startswith(f"{tmp_path / 'x'}: Input/output error (EIO); ")
    assert storage_errno(sqlite3.OperationalError("database or disk is full")) == errno.ENOSPC
    assert storage_errno(sqlite3.OperationalError("attempt to write a readonly database")) == errno.EROFS


@pytest.mark.parametrize(
    "exc",
    [ValueError("bad value"), OSError(errno.EINVAL, "Invalid argument"), sqlite3.OperationalError("no such table: x")],
)
def test_other_errors_are_not_the_storages(exc):
    """A bug stays a traceback: only the storage's errnos (and SQLite's words for them) make a line."""
    assert storage_errno(exc) is None and storage_error_line(exc) is None
