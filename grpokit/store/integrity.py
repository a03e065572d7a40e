"""What a checkpoint knows about the store, and the check a resume makes against it.

Each written step has a digest: SHA-256 over its rollout rows (every column but the row id, in insertion order) and
its metric rows (by name), and its per-token values and the rows of the images it first showed when it has any
(``token_values``, ``images``: a step without them digests as in a store written before they existed; so does a null
in the rollouts' last added columns), read back from the database, so the digest is of what SQLite holds.
The digests are chained (``chain_k = SHA-256(chain_{k-1} + digest_k)``, ``chain_0 = ""``); a checkpoint of step N
records chain_N, and a resume from it recomputes chain_N from the file: a store that is missing, empty, truncated,
not SQLite, damaged inside (SQLite's ``quick_check``), short of a step, or changed in any stored value is refused
before anything is written. Evaluation rows are not covered (a resume never rewrites them).
"""

from __future__ import annotations

import hashlib
import sqlite3
from pathlib import Path

from grpokit.store import images, token_values
from grpokit.store.errors import StoreError

EMPTY_CHAIN = ""


def step_digest(conn: sqlite3.Connection, step: int) -> str:
    """SHA-256 hex of step ``step``'s rollout and metric rows as stored."""
    columns = [row[1] for row in conn.execute("PRAGMA table_info(rollouts)") if row[1] != "id"]
    rollouts = conn.execute(f"SELECT {', '.join(columns)} FROM rollouts WHERE step = ? ORDER BY id", (step,))
    metrics = conn.execute("SELECT name, value FROM step_metrics WHERE step = ? ORDER BY name", (step,))
    rows = [_trimmed(row, columns) for row in rollouts.fetchall()]
    digest = hashlib.sha256(repr(rows).encode())
    digest.update(repr(metrics.fetchall()).encode())
    for extra in (token_values.step_rows(conn, step), images.step_rows(conn, step)):
        if extra:  # a step without them digests as in a store written before they existed
            digest.update(repr(extra).encode())
    return digest.hexdigest()


# The rollouts' columns added last, in order: a NULL at the end of a row digests as a store written before it.
_LATE_COLUMNS = ("token_versions", "images")


def _trimmed(row: tuple, columns: list[str]) -> tuple:
    n = len(row)
    while n and columns[n - 1] in _LATE_COLUMNS and row[n - 1] is None:
        n -= 1
    return row[:n]


def next_chain(chain: str, digest: str) -> str:
    return hashlib.sha256((chain + digest).encode()).hexdigest()


def chain_through(conn: sqlite3.Connection, first: int, step: int) -> str:
    """The digests of steps first..step chained (``first`` is 1 but in a store a resume from another folder's
    checkpoint started)."""
    chain = EMPTY_CHAIN
    for s in range(first, step + 1):
        chain = next_chain(chain, step_digest(conn, s))
    return chain


def check_store(path: Path, first: int, step: int, chain: str | None, checkpoint: str) -> str:
    """Check that the store at ``path`` holds steps ``first``..``step`` as checkpoint ``checkpoint`` recorded them
    (``chain``; None: a checkpoint without a record, only the steps are checked). Returns their chain, or raises a
    StoreError naming the file and what is wrong with it."""
    fix = "restore the file from a copy, or start the run again with overwrite: true"
    steps = f"steps {first}..{step}"
    if not path.is_file():
        raise StoreError(f"{path} is missing, but checkpoint {checkpoint} needs its {steps}; {fix}.")
    if path.stat().st_size == 0:
        raise StoreError(f"{path} is empty (0 bytes), but checkpoint {checkpoint} needs its {steps}; {fix}.")
    conn = sqlite3.connect(path, isolation_level=None)  # writable: a WAL a kill left behind is replayed
    try:
        problems = [row[0] for row in conn.execute("PRAGMA quick_check")]
        if problems != ["ok"]:
            raise StoreError(f"{path} is damaged (SQLite: {problems[0]}); {fix}.")
        tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if not {"meta", "steps", "rollouts", "step_metrics"} <= tables:
            raise StoreError(f"{path} is not a grpokit rollout store (no steps or rollouts table); {fix}.")
        query = "SELECT step FROM steps WHERE step BETWEEN ? AND ? ORDER BY step"
        stored = [s for (s,) in conn.execute(query, (first, step))]
        if stored != list(range(first, step + 1)):
            missing = sorted(set(range(first, step + 1)) - set(stored))[0]
            raise StoreError(
                f"{path} lacks step {missing} of the {steps} that checkpoint {checkpoint} needs (it was truncated "
                f"or replaced); {fix}, or resume from an earlier checkpoint (resume_from=RUN/checkpoints/step-K)."
            )
        found = chain_through(conn, first, step)
    except sqlite3.DatabaseError as err:
        raise StoreError(f"{path} is damaged ({err}): it cannot be read as a rollout store; {fix}.") from None
    finally:
        conn.close()
    if chain is not None and found != chain:
        raise StoreError(
            f"{path} does not hold what checkpoint {checkpoint} recorded of its {steps} (a stored value changed: "
            f"the file is corrupted); {fix}."
        )
    return found
