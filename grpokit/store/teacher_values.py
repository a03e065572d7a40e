"""The teacher's log-prob of every sampled token, kept in the rollout store beside the student's (on-policy
distillation, grpokit/train/teacher/): one row of the ``teacher_logprobs`` table per completion trained on, its
log-probs as little-endian float32 (4 bytes a token: exact, unlike the float16 of ``token_values``), so a replay or
the explorer needs no second call to the teacher.

A store written before the table existed gets it when opened for writing (``CREATE TABLE IF NOT EXISTS`` in the
schema); every reader here treats its absence as no teacher log-probs. Importing this module loads no torch.
"""

from __future__ import annotations

import sqlite3
import struct

TABLE = "teacher_logprobs"
INSERT = f"INSERT INTO {TABLE} (step, prompt_index, completion_index, logprob, tokens_key) VALUES (?, ?, ?, ?, ?)"
KEY_COLUMN = "tokens_key"  # added to tables written before it (RolloutStore opened for writing)


def encode(values: list[float]) -> bytes:
    """``values`` as little-endian float32."""
    return struct.pack(f"<{len(values)}f", *values)


def decode(blob: bytes) -> list[float]:
    return list(struct.unpack(f"<{len(blob) // 4}f", blob))


def rows(step: int, records: list) -> list[tuple]:
    """The table's rows of ``step``'s records (``RolloutRecord``s) that carry teacher log-probs."""
    return [
        (step, r.prompt_index, r.completion_index, r.teacher_logprobs, getattr(r, "teacher_tokens_key", None))
        for r in records
        if getattr(r, "teacher_logprobs", None) is not None
    ]


def read(conn: sqlite3.Connection, step: int | None = None) -> dict[tuple[int, int, int], list[float]]:
    """{(step, prompt_index, completion_index): the teacher's log-probs of its tokens}; {} for a store without the
    table."""
    found = conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (TABLE,)).fetchone()
    if found is None:
        return {}
    sql = f"SELECT step, prompt_index, completion_index, logprob FROM {TABLE}"
    params: tuple = () if step is None else (step,)
    if step is not None:
        sql += " WHERE step = ?"
    return {(s, p, c): decode(blob) for s, p, c, blob in conn.execute(sql + " ORDER BY 1, 2, 3", params)}


def by_tokens_key(conn: sqlite3.Connection, after: int) -> dict[str, list[float]]:
    """{tokens_key: the teacher's log-probs} of the steps after ``after`` (the values a resumed run may reuse for the
    same tokens, :mod:`grpokit.train.teacher.replay`); {} for a store without the table or the column."""
    columns = {row[1] for row in conn.execute(f"PRAGMA table_info({TABLE})")}
    if KEY_COLUMN not in columns:
        return {}
    sql = f"SELECT {KEY_COLUMN}, logprob FROM {TABLE} WHERE step > ? AND {KEY_COLUMN} IS NOT NULL"
    return {key: decode(blob) for key, blob in conn.execute(sql, (after,))}
