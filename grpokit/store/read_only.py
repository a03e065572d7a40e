"""Opening a rollout store for reading wherever it lies: the file with ``mode=ro``; on read-only storage or a full
disk (no ``-shm`` file and no way to make one) the file as ``immutable``, or a private copy when its ``-wal`` file
holds steps not in the main file yet (store.py's docstring)."""

from __future__ import annotations

import contextlib
import shutil
import sqlite3
import tempfile
from pathlib import Path

from grpokit.store.errors import StoreError

# SQLite's errors for a WAL store whose -shm file (the readers' shared index) cannot be made or used: read-only
# storage (CANTOPEN, READONLY_CANTINIT) or a full disk (IOERR_SHMSIZE and its kin).
_NO_SHARED_MEMORY = {
    "SQLITE_CANTOPEN",
    "SQLITE_READONLY_CANTINIT",
    "SQLITE_IOERR_SHMOPEN",
    "SQLITE_IOERR_SHMSIZE",
    "SQLITE_IOERR_SHMMAP",
}


def no_shared_memory(err: sqlite3.OperationalError) -> bool:
    """SQLite could not set up the store's -shm file (:data:`_NO_SHARED_MEMORY`)."""
    name = getattr(err, "sqlite_errorname", None)  # Python >= 3.11
    if name is not None:
        return name in _NO_SHARED_MEMORY
    return str(err) in ("unable to open database file", "disk I/O error")


def read_only_uri(path: Path) -> tuple[str, str | None]:
    """(the URI a read-only connection to ``path`` opens, the temporary folder of its private copy or None): the file
    with ``mode=ro``; where that cannot open a WAL store (read-only storage or a full disk: no ``-shm`` file and no way
    to create one), the file as ``immutable``, or a private copy when its ``-wal`` file holds steps not in the main
    file yet. The caller removes the copy's folder when done."""
    uri = f"{path.resolve().as_uri()}?mode=ro"
    try:
        with contextlib.closing(sqlite3.connect(uri, uri=True, timeout=10)) as conn:
            conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
        return uri, None
    except sqlite3.OperationalError as err:
        if not no_shared_memory(err):
            raise StoreError(f"{path} cannot be read ({err})") from err
    except sqlite3.DatabaseError as err:
        raise StoreError(f"{path} is not a grpokit rollout store ({err})") from err
    wal = path.with_name(path.name + "-wal")
    if not (wal.is_file() and wal.stat().st_size > 0):
        return f"{path.resolve().as_uri()}?immutable=1", None
    copy_dir = tempfile.mkdtemp(prefix="grpokit-store-")
    copy = Path(copy_dir) / path.name
    try:
        shutil.copyfile(path, copy)
        shutil.copyfile(wal, copy.with_name(copy.name + "-wal"))
    except OSError as err:
        shutil.rmtree(copy_dir, ignore_errors=True)
        raise StoreError(
            f"{path} is on read-only storage and its last steps are still in {wal.name}, which SQLite "
            f"can only read from a copy; copying it to {copy_dir} failed ({err.strerror}); set TMPDIR to a "
            "folder with room, or copy the run folder to writable storage"
        ) from err
    return f"{copy.as_uri()}?mode=ro", copy_dir
