"""The images a run's prompts showed the model, kept once each by content in the run folder: ``RUN/images/<sha256>.png``
(the PNG whose bytes hash to its name), described by the ``images`` table of rollouts.sqlite (its hash, size in bytes,
width, height, the first step that showed it, and whether the file was written), and referenced by each rollout's
``images`` column (a JSON list of the hashes of its prompt's images, in the prompt's order, then of the images tools
returned in its completion, in order; a tool turn of its ``conversation`` names its own). An evaluation's prompts'
images are kept the same way (each ``eval_prompts`` row's ``images`` column), their rows marked ``eval`` 1 with the
evaluation's step, so no step's digest (``store/integrity.py``) changes after the step was written.

Durability: a new image's file is written to a temporary name beside it, fsynced and renamed (then the folder is
fsynced) *before* the step's transaction commits its row, so a row never names a file that is not whole; a kill -9 at
any point leaves at most a temporary file (``.<sha256>.png.tmp``) or a file no row names, and both are removed when the
store is rolled back for a resume (:meth:`ImageFiles.clean`), so a resumed run writes the same files as a straight one.

``log_multimodal`` (TRL's name, default true) false stores no image (the rollouts still name their hashes);
``store_images_max_mb`` caps the bytes of image files a run keeps: an image that would pass it gets a row with
``stored`` 0 and no file. Importing this module loads no torch.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import sqlite3
from pathlib import Path
from typing import Any

TABLE = "images"
FOLDER = "images"
TMP_SUFFIX = ".tmp"
_COLUMNS = ("sha256", "step", "bytes", "width", "height", "stored")
EVAL_COLUMN = "eval"  # 1: first shown by the evaluation at `step` (after the step's digest was taken); 0: by training
_WRITTEN = (*_COLUMNS, EVAL_COLUMN)
INSERT = f"INSERT INTO {TABLE} ({', '.join(_WRITTEN)}) VALUES ({', '.join('?' for _ in _WRITTEN)})"


def png_bytes(image: Any) -> bytes:
    """The image's PNG bytes (what its hash is of: ``models.vision_inputs.image_hash``)."""
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def has_table(conn: sqlite3.Connection) -> bool:
    found = conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (TABLE,)).fetchone()
    return found is not None


def has_eval_column(conn: sqlite3.Connection) -> bool:
    return EVAL_COLUMN in {row[1] for row in conn.execute(f"PRAGMA table_info({TABLE})")}


def add_eval_column(conn: sqlite3.Connection) -> None:
    """Give an ``images`` table written before evaluations' images were kept its ``eval`` column (its rows: 0)."""
    if has_table(conn) and not has_eval_column(conn):
        conn.execute(f"ALTER TABLE {TABLE} ADD COLUMN {EVAL_COLUMN} INTEGER NOT NULL DEFAULT 0")


def shown(records: list) -> list[tuple[str, Any]]:
    """(sha256, image) of each image ``records`` show: rollout records' or evaluated prompts' (``images``: hashes,
    ``image_sources``: the images; attributes or dict keys)."""
    pairs = []
    for record in records:
        pairs += zip(_field(record, "images") or (), _field(record, "image_sources") or ())
    return pairs


def _field(record: Any, name: str) -> Any:
    return record.get(name) if isinstance(record, dict) else getattr(record, name, None)


class ImageFiles:
    """The run folder's ``images/`` folder: each image once, as ``<sha256>.png``, written atomically."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)

    def path(self, sha256: str) -> Path:
        return self.folder / f"{sha256}.png"

    def holds(self, sha256: str) -> bool:
        """Whether ``<sha256>.png`` is there and its bytes hash to its name."""
        try:
            return hashlib.sha256(self.path(sha256).read_bytes()).hexdigest() == sha256
        except OSError:
            return False

    def write(self, sha256: str, data: bytes) -> None:
        """``data`` as ``<sha256>.png``: a temporary file, fsynced, renamed over the name, the folder fsynced (a
        reader or a resume never sees a part of it under its name)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        final = self.path(sha256)
        tmp = self.folder / f".{final.name}{TMP_SUFFIX}"
        try:
            with open(tmp, "wb") as out:
                out.write(data)
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, final)
        except BaseException:
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
            raise
        _fsync_folder(self.folder)

    def clean(self, keep: set[str]) -> int:
        """Remove the temporary files a kill left and the images no row names (``keep``: the hashes of the rows'
        written files); returns how many files went."""
        if not self.folder.is_dir():
            return 0
        removed = 0
        for file in self.folder.iterdir():
            name = file.name
            stray = name.endswith(TMP_SUFFIX) or (name.endswith(".png") and name[: -len(".png")] not in keep)
            if stray and file.is_file():
                file.unlink()
                removed += 1
        return removed


def _fsync_folder(folder: Path) -> None:
    with contextlib.suppress(OSError):  # a platform that cannot open a folder (Windows) keeps the rename as is
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


class ImageWriter:
    """Writes the images a step's records show that the store does not have yet (``log``: TRL's log_multimodal;
    ``max_bytes``: store_images_max_mb in bytes, None: no cap)."""

    def __init__(self, files: ImageFiles, log: bool = True, max_bytes: int | None = None):
        self.files, self.log, self.max_bytes = files, log, max_bytes

    def rows(self, conn: sqlite3.Connection, step: int, records: list, evaluation: bool = False) -> list[tuple]:
        """The ``images`` rows of the images ``records`` show first at ``step`` (their files written first, durably;
        ``evaluation``: shown by the evaluation at ``step``, rows marked ``eval`` 1)."""
        if not self.log:
            return []
        wanted: dict[str, Any] = {}
        for sha, image in shown(records):
            wanted.setdefault(sha, image)
        if not wanted:
            return []
        marks = ", ".join("?" for _ in wanted)
        known = {s for (s,) in conn.execute(f"SELECT sha256 FROM {TABLE} WHERE sha256 IN ({marks})", list(wanted))}
        used = conn.execute(f"SELECT coalesce(sum(bytes), 0) FROM {TABLE} WHERE stored = 1").fetchone()[0]
        out = []
        for sha, image in wanted.items():
            if sha in known:
                continue
            data = png_bytes(image)
            if hashlib.sha256(data).hexdigest() != sha:
                raise ValueError(f"an image named {sha[:12]}... encodes to other PNG bytes; it cannot be stored")
            stored = self.max_bytes is None or used + len(data) <= self.max_bytes
            if stored:
                if not self.files.holds(sha):  # a file a killed step wrote is whole (renamed) and kept
                    self.files.write(sha, data)
                used += len(data)
            out.append((sha, step, len(data), image.width, image.height, int(stored), int(evaluation)))
        return out


def info(conn: sqlite3.Connection, hashes: list[str]) -> dict[str, dict]:
    """{sha256: {"bytes", "width", "height", "step", "stored"}} of the stored rows among ``hashes``."""
    if not hashes or not has_table(conn):
        return {}
    marks = ", ".join("?" for _ in hashes)
    sql = f"SELECT {', '.join(_COLUMNS)} FROM {TABLE} WHERE sha256 IN ({marks})"
    return {row[0]: dict(zip(_COLUMNS[1:], row[1:])) for row in conn.execute(sql, list(hashes))}


def written(conn: sqlite3.Connection) -> set[str]:
    """The hashes whose files the store's rows say were written."""
    if not has_table(conn):
        return set()
    return {s for (s,) in conn.execute(f"SELECT sha256 FROM {TABLE} WHERE stored = 1")}


def step_rows(conn: sqlite3.Connection, step: int) -> list[tuple]:
    """Step ``step``'s rows as stored, for its digest (``store/integrity.py``): training's, not its evaluation's
    (written after the digest was taken); [] without the table."""
    if not has_table(conn):
        return []
    training = f" AND {EVAL_COLUMN} = 0" if has_eval_column(conn) else ""
    sql = f"SELECT {', '.join(_COLUMNS)} FROM {TABLE} WHERE step = ?{training} ORDER BY sha256"
    return conn.execute(sql, (step,)).fetchall()
