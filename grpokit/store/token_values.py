"""Per-token values in the rollout store: what the learner computed for each token of a completion, kept only when
``run.store_token_values`` names them (:class:`grpokit.store.settings.StoreSettings`).

One row of the ``token_values`` table per completion trained on (``store/sql_schema.py``): its tokens, each decoded
on its own (a JSON list of strings), and one BLOB per kept value, a little-endian float16 per token (2 bytes a token
and value; a float16 keeps 3 significant digits, and values beyond +-65504 are clamped to it). The values:

- ``logprob``: the learner's log-prob of the token (at the sampling temperature), from the update's first pass;
- ``gap``: that log-prob minus the sampler's (the engine's) log-prob of the same token: the sampler-learner gap;
- ``entropy``: the learner's entropy of the next-token distribution there;
- ``weight``: the token's weight in the policy term (``algos.losses.token_weights``) in the update's last pass over
  it (with num_iterations > 1, the pass whose ratio has moved): 0 where the loss clipped or a mask removed it, 1 for
  an ordinary token, the importance weight where a sampler's weights apply.

A store written before the table existed gets it when opened for writing; every reader here treats its absence as
no per-token values. Importing this module loads no torch.
"""

from __future__ import annotations

import json
import math
import sqlite3
import struct
from typing import Any

# name -> what it is (the report's selector and the settings' check read it)
TOKEN_VALUES = {
    "logprob": "the learner's log-prob of the token",
    "gap": "learner log-prob minus sampler log-prob",
    "entropy": "the learner's entropy at the token",
    "weight": "the token's weight in the policy loss (0: clipped or masked)",
}
FLOAT16_MAX = 65504.0
TABLE = "token_values"
_COLUMNS = ("step", "prompt_index", "completion_index", "tokens", *TOKEN_VALUES)
INSERT = f"INSERT INTO {TABLE} ({', '.join(_COLUMNS)}) VALUES ({', '.join('?' for _ in _COLUMNS)})"


def encode(values: list[float]) -> bytes:
    """``values`` as little-endian float16 (clamped to +-65504; NaN stays NaN)."""
    clamped = [v if math.isnan(v) else max(-FLOAT16_MAX, min(FLOAT16_MAX, v)) for v in values]
    return struct.pack(f"<{len(clamped)}e", *clamped)


def decode(blob: bytes | None) -> list[float] | None:
    """The floats of a stored value (None: not kept)."""
    if blob is None:
        return None
    return list(struct.unpack(f"<{len(blob) // 2}e", blob))


def rows(step: int, records: list) -> list[tuple]:
    """The ``token_values`` rows of ``step``'s records (``RolloutRecord``s) that carry ``per_token`` values."""
    out = []
    for record in records:
        values = record.per_token
        if values is None:
            continue
        tokens = json.dumps(values["tokens"], ensure_ascii=False)
        blobs = [values.get(name) for name in TOKEN_VALUES]
        out.append((step, record.prompt_index, record.completion_index, tokens, *blobs))
    return out


def has_table(conn: sqlite3.Connection) -> bool:
    """Whether the store has the table (a store written before it existed has not, if never opened for writing)."""
    found = conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (TABLE,)).fetchone()
    return found is not None


def read(conn: sqlite3.Connection, step: int | None = None) -> list[dict[str, Any]]:
    """The stored per-token values (of ``step``, or every step) by (step, prompt_index, completion_index): dicts with
    those three, ``tokens`` (list of str) and each value's list of floats (None where not kept); [] for a store
    without the table."""
    if not has_table(conn):
        return []
    sql = f"SELECT {', '.join(_COLUMNS)} FROM {TABLE}"
    params: tuple = ()
    if step is not None:
        sql += " WHERE step = ?"
        params = (step,)
    out = []
    for row in conn.execute(sql + " ORDER BY step, prompt_index, completion_index", params):
        item = _typed(dict(zip(_COLUMNS, row)))
        if item is not None:
            out.append(item)
    return out


def _typed(item: dict[str, Any]) -> dict[str, Any] | None:
    """A stored row with its tokens decoded and each kept value one float per token (NaN where a blob is short);
    None for a row a hand-edited store left without integer keys or a JSON list of token texts."""
    try:
        tokens = json.loads(item["tokens"]) if isinstance(item["tokens"], str) else None
    except (json.JSONDecodeError, RecursionError):
        tokens = None
    keys = (item["step"], item["prompt_index"], item["completion_index"])
    if not isinstance(tokens, list) or not all(isinstance(k, int) and not isinstance(k, bool) for k in keys):
        return None
    item["tokens"] = [t if isinstance(t, str) else str(t) for t in tokens]
    for name in TOKEN_VALUES:
        blob = item[name]
        values = decode(blob[: len(blob) // 2 * 2]) if isinstance(blob, bytes) else None
        if values is not None and len(values) < len(tokens):
            values += [math.nan] * (len(tokens) - len(values))
        item[name] = values
    return item


def kept_names(conn: sqlite3.Connection) -> list[str]:
    """The values the store holds for at least one completion, in :data:`TOKEN_VALUES`' order."""
    if not has_table(conn):
        return []
    return [
        name
        for name in TOKEN_VALUES
        if conn.execute(f"SELECT 1 FROM {TABLE} WHERE {name} IS NOT NULL LIMIT 1").fetchone() is not None
    ]


def step_rows(conn: sqlite3.Connection, step: int) -> list[tuple]:
    """Step ``step``'s rows as stored, for its digest (``store/integrity.py``); [] without the table."""
    if not has_table(conn):
        return []
    sql = f"SELECT {', '.join(_COLUMNS)} FROM {TABLE} WHERE step = ? ORDER BY prompt_index, completion_index"
    return conn.execute(sql, (step,)).fetchall()
