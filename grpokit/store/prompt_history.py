"""Each training prompt's history, one row per prompt in the rollout store's ``prompt_history`` table.

A prompt is named by its dataset row (``prompt_index``) and ``prompt_hash``, the first 16 hex digits of the SHA-256 of
its rendered text (a resumed run on edited data shows up as another hash). The row holds how many steps sampled it and
how many completions in all, its first and last step, and over its ``window`` most recent completions (the meta keys
``prompt_history.window``, default 16, and ``prompt_history.threshold``, the success threshold, default 1.0): the
rewards themselves (``recent``, JSON, oldest first, null for a reward that failed), the pass rate (the fraction with
reward >= threshold; a failed reward does not pass), their mean and (population) variance, failed rewards left out;
and ``solved_streak``, the visits (steps that drew it) in a row, up to the last, in which every completion passed.

:func:`update` runs inside :meth:`RolloutStore.write_step`'s transaction, after the step's rollouts are inserted, so
the table and the rollouts are never out of step, even after SIGKILL. The table is a function of the ``rollouts``
table: :func:`rebuild` recomputes it step by step with the same code, which ``rollback_after`` does when it removed
rows, so a resumed run's table equals the uninterrupted run's. A curriculum (grpokit/data/curriculum.py) reads it.

    SELECT prompt_index, pass_rate, samples, last_step FROM prompt_history ORDER BY pass_rate
    SELECT count(*) FROM prompt_history WHERE pass_rate = 1.0 AND recent_samples >= 8
"""

from __future__ import annotations

import hashlib
import json
import sqlite3

TABLE = "prompt_history"
DEFAULT_WINDOW, DEFAULT_THRESHOLD = 16, 1.0
_WINDOW_KEY, _THRESHOLD_KEY = "prompt_history.window", "prompt_history.threshold"

SCHEMA = f"""
CREATE TABLE IF NOT EXISTS {TABLE} (
    prompt_index   INTEGER PRIMARY KEY,
    prompt_hash    TEXT NOT NULL,
    steps_sampled  INTEGER NOT NULL,
    samples        INTEGER NOT NULL,
    first_step     INTEGER NOT NULL,
    last_step      INTEGER NOT NULL,
    recent         TEXT NOT NULL,
    recent_samples INTEGER NOT NULL,
    pass_rate      REAL NOT NULL,
    mean_reward    REAL,
    reward_var     REAL,
    solved_streak  INTEGER NOT NULL
) STRICT;
"""
COLUMNS = (
    "prompt_index",
    "prompt_hash",
    "steps_sampled",
    "samples",
    "first_step",
    "last_step",
    "recent",
    "recent_samples",
    "pass_rate",
    "mean_reward",
    "reward_var",
    "solved_streak",
)
_UPSERT = f"INSERT OR REPLACE INTO {TABLE} ({', '.join(COLUMNS)}) VALUES ({', '.join('?' * len(COLUMNS))})"


def prompt_hash(text: str) -> str:
    """The first 16 hex digits of the SHA-256 of a prompt's rendered text (UTF-8)."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def window_stats(recent: list[float | None], threshold: float) -> tuple[float, float | None, float | None]:
    """(pass rate, mean, population variance) of the rewards ``recent``: a None reward counts as not passed and is
    left out of the mean and variance (None for both when every reward is None). [1, 0, 1, None], threshold 1:
    pass rate 2/4 = 0.5, mean 2/3, variance ((1/3)^2 * 2 + (2/3)^2) / 3 = 2/9."""
    scored = [r for r in recent if r is not None]
    passed = sum(1 for r in scored if r >= threshold)
    if not scored:
        return passed / max(len(recent), 1), None, None
    mean = sum(scored) / len(scored)
    return passed / len(recent), mean, sum((r - mean) ** 2 for r in scored) / len(scored)


def settings(conn: sqlite3.Connection) -> tuple[int, float]:
    """(window, threshold) the store keeps the history with (its meta keys, else the defaults)."""
    found = dict(conn.execute("SELECT key, value FROM meta WHERE key IN (?, ?)", (_WINDOW_KEY, _THRESHOLD_KEY)))
    return int(found.get(_WINDOW_KEY, DEFAULT_WINDOW)), float(found.get(_THRESHOLD_KEY, DEFAULT_THRESHOLD))


def create(conn: sqlite3.Connection, strict: bool) -> None:
    """Create the table (without STRICT on an SQLite before 3.37); a store written before it existed gets its rows
    rebuilt from the rollouts. Call outside a transaction."""
    conn.executescript(SCHEMA if strict else SCHEMA.replace(") STRICT;", ");"))
    empty = conn.execute(f"SELECT 1 FROM {TABLE} LIMIT 1").fetchone() is None
    if empty and conn.execute("SELECT 1 FROM rollouts LIMIT 1").fetchone() is not None:
        _in_one_transaction(conn, lambda: rebuild(conn))


def configure(conn: sqlite3.Connection, window: int, threshold: float) -> None:
    """Keep the history over ``window`` completions with success ``threshold``; when either differs from what the
    store kept, the table is rebuilt with the new ones (in one transaction). Call outside a transaction."""
    if window < 1:
        raise ValueError(f"prompt history window={window} must be >= 1")
    if settings(conn) == (int(window), float(threshold)):
        return
    rows = [(_WINDOW_KEY, str(int(window))), (_THRESHOLD_KEY, repr(float(threshold)))]

    def keep_and_rebuild() -> None:
        conn.executemany("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", rows)
        rebuild(conn)

    _in_one_transaction(conn, keep_and_rebuild)


def _in_one_transaction(conn: sqlite3.Connection, work) -> None:
    """``work()`` in one write transaction: all of it or, on any error, none."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        work()
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise


def update(conn: sqlite3.Connection, step: int) -> None:
    """Fold ``step``'s stored rollouts into the history (inside the transaction that inserted them)."""
    window, threshold = settings(conn)
    sql = "SELECT prompt_index, prompt, reward FROM rollouts WHERE step = ? ORDER BY prompt_index, completion_index"
    by_prompt: dict[int, tuple[str, list]] = {}
    for index, text, reward in conn.execute(sql, (step,)):
        by_prompt.setdefault(index, (text, []))[1].append(reward)
    for index, (text, rewards) in by_prompt.items():
        old = conn.execute(
            f"SELECT steps_sampled, samples, first_step, recent, solved_streak FROM {TABLE} WHERE prompt_index = ?",
            (index,),
        ).fetchone()
        steps, samples, first, recent, streak = old if old is not None else (0, 0, step, "[]", 0)
        recent = (json.loads(recent) + rewards)[-window:]
        pass_rate, mean, var = window_stats(recent, threshold)
        solved = all(r is not None and r >= threshold for r in rewards)  # this visit: every completion passed
        row = (index, prompt_hash(text), steps + 1, samples + len(rewards), first, step, json.dumps(recent))
        conn.execute(_UPSERT, (*row, len(recent), pass_rate, mean, var, streak + 1 if solved else 0))


def rebuild(conn: sqlite3.Connection) -> None:
    """Recompute the whole table from the stored rollouts, step after step (inside a transaction)."""
    conn.execute(f"DELETE FROM {TABLE}")
    for (step,) in conn.execute("SELECT DISTINCT step FROM rollouts ORDER BY step").fetchall():
        update(conn, step)


def read(conn: sqlite3.Connection) -> list[dict]:
    """Every prompt's row as a dict (``recent`` decoded), by prompt_index; [] for a store without the table."""
    if not conn.execute("SELECT 1 FROM sqlite_master WHERE name = ?", (TABLE,)).fetchone():
        return []
    rows = [dict(zip(COLUMNS, row)) for row in conn.execute(f"SELECT {', '.join(COLUMNS)} FROM {TABLE} ORDER BY 1")]
    for row in rows:
        row["recent"] = json.loads(row["recent"])
    return rows
