"""Values read back from a rollout store as its schema declares them, whatever the file holds.

A run folder can come from someone else, and its ``rollouts.sqlite`` is a file anyone can edit. New stores use
STRICT tables (store/sql_schema.py), so SQLite itself refuses text where an INTEGER belongs; a store written before
(or rebuilt by hand) can hold anything: text in ``completion_tokens``, a number in ``rewards``' JSON where a dict
belongs. The readers here hand the report, `grpokit compare` and `grpokit inspect` each value of its declared type or
None (a row whose identifying columns are wrong is left out), and count what they replaced, so a page names the
table and column instead of failing or drawing the value.

:func:`wrong_types` counts a whole store's wrong values in SQL (one pass a table), for the line a page shows.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
from typing import Any

from grpokit.store.sql_schema import schema_sql

_PYTHON = {"INTEGER": (int,), "REAL": (float, int), "TEXT": (str,), "BLOB": (bytes,)}
_SQL = {"INTEGER": ("integer",), "REAL": ("real", "integer"), "TEXT": ("text",), "BLOB": ("blob",)}
# Columns without which a row cannot be placed: a wrong value there leaves the row out.
REQUIRED = {
    "steps": ("step",),
    "rollouts": ("step", "prompt_index", "completion_index"),
    "step_metrics": ("step", "name"),
    "evals": ("step", "dataset", "name"),
    "eval_prompts": ("step", "dataset", "prompt_index", "correct", "samples"),
    "token_values": ("step", "prompt_index", "completion_index", "tokens"),
}
# JSON columns: what each must decode to (None: SQL NULL only where the column allows it).
JSON_COLUMNS = {("rollouts", "rewards"), ("rollouts", "extra"), ("rollouts", "conversation")}
JSON_COLUMNS |= {("rollouts", "token_versions"), ("token_values", "tokens")}


def _declared() -> dict[str, dict[str, tuple[str, bool]]]:
    """{table: {column: (declared type, NOT NULL)}} of the schema this grpokit writes."""
    with contextlib.closing(sqlite3.connect(":memory:")) as conn:
        conn.executescript(schema_sql(sqlite3.sqlite_version_info))
        tables = [row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        return {
            table: {row[1]: (row[2].upper(), bool(row[3])) for row in conn.execute(f"PRAGMA table_info({table})")}
            for table in tables
        }


DECLARED = _declared()


class Problems:
    """What a store's readers replaced: {"table.column": count of values}; ``lines()`` for a page."""

    def __init__(self) -> None:
        self.found: dict[str, int] = {}
        self.shapes: set[str] = set()  # JSON columns whose decoded value had the wrong shape

    def add(self, table: str, column: str, n: int = 1) -> None:
        key = f"{table}.{column}"
        self.found[key] = self.found.get(key, 0) + n

    def shape(self, table: str, column: str) -> None:
        self.shapes.add(f"{table}.{column}")


def fits(value: Any, declared: str, not_null: bool) -> bool:
    """Whether ``value`` (as sqlite3 returned it) is of the ``declared`` column type."""
    if value is None:
        return not not_null
    return isinstance(value, _PYTHON.get(declared, (object,))) and not isinstance(value, bool)


def clean(table: str, columns: tuple[str, ...] | list[str], row: tuple, problems: Problems) -> tuple | None:
    """``row`` (of ``columns`` of ``table``) with each value of the wrong type replaced by None and counted; None
    when a :data:`REQUIRED` column's value is wrong (the row cannot be placed)."""
    spec = DECLARED[table]
    out = []
    for column, value in zip(columns, row):
        declared, not_null = spec.get(column, ("ANY", False))
        if fits(value, declared, not_null):
            out.append(value)
            continue
        problems.add(table, column)
        if column in REQUIRED.get(table, ()):
            return None
        out.append(None)
    return tuple(out)


def load_json(text: str | None, table: str, column: str, problems: Problems, kind: type) -> Any:
    """``text`` decoded, when it decodes to a ``kind``; else None, noted as a value of the wrong shape."""
    if text is None:
        return None
    try:
        value = json.loads(text)
    except (json.JSONDecodeError, TypeError, RecursionError):
        value = None
    if isinstance(value, kind):
        return value
    problems.shape(table, column)
    return None


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def number_or_none(value: Any) -> bool:
    return value is None or _is_number(value)


def rewards_of(text: str | None, problems: Problems) -> dict[str, float | None]:
    """``rollouts.rewards``: {function: value}, each value a number or None (a wrong one becomes None)."""
    rewards = load_json(text, "rollouts", "rewards", problems, dict) or {}
    if not all(number_or_none(v) for v in rewards.values()):
        problems.shape("rollouts", "rewards")
        rewards = {name: (v if number_or_none(v) else None) for name, v in rewards.items()}
    return {str(name): v for name, v in rewards.items()}


def conversation_of(text: str | None, problems: Problems) -> dict | None:
    """``rollouts.conversation`` when it has the shape the page draws (store/record.conversation_record), else None
    (the completion's text is shown instead)."""
    value = load_json(text, "rollouts", "conversation", problems, dict)
    if value is None:
        return None
    turns = value.get("turns")
    good = (
        isinstance(turns, list)
        and all(isinstance(t, dict) and all(isinstance(t.get(k), str) for k in ("role", "text")) for t in turns)
        and all(_is_number(t["duration"]) for t in turns if "duration" in t)
        and _is_number(value.get("tool_rounds"))
    )
    if not good:
        problems.shape("rollouts", "conversation")
        return None
    return value


def wrong_types(conn: sqlite3.Connection, tables: list[str]) -> dict[str, int]:
    """{"table.column": how many values are not of the declared type, or not valid JSON where JSON belongs} over
    the whole of each of ``tables`` (those the file has), in one query a table."""
    out: dict[str, int] = {}
    for table in tables:
        present = {row[1] for row in conn.execute(f"PRAGMA table_info({table})")} & set(DECLARED[table])
        columns = [c for c in DECLARED[table] if c in present]
        if not columns:
            continue
        tests = [_wrong_sql(table, c) for c in columns]
        counts = conn.execute(f"SELECT {', '.join(f'coalesce(sum({t}), 0)' for t in tests)} FROM {table}").fetchone()
        out |= {f"{table}.{c}": n for c, n in zip(columns, counts) if n}
    return out


def _wrong_sql(table: str, column: str) -> str:
    declared, not_null = DECLARED[table][column]
    allowed = list(_SQL.get(declared, ()))
    if not not_null:
        allowed.append("null")
    listed = ", ".join(f"'{t}'" for t in allowed)
    test = f"typeof({column}) NOT IN ({listed})"
    if (table, column) in JSON_COLUMNS:
        test += f" OR ({column} IS NOT NULL AND typeof({column}) = 'text' AND NOT json_valid({column}))"
    return f"({test})"


def problem_lines(counted: dict[str, int], problems: Problems) -> list[str]:
    """One line per column with wrong values, naming the table and column and what the page shows instead."""
    lines = [
        f"{key}: {n} value{'s' * (n != 1)} of the wrong type (not {DECLARED[key.split('.')[0]][key.split('.')[1]][0]}"
        f"{', or not JSON' if tuple(key.split('.')) in JSON_COLUMNS else ''}): shown as -, or the row left out"
        for key, n in sorted(counted.items())
    ]
    lines += [
        f"{key}: {n} value{'s' * (n != 1)} read of the wrong type: shown as -, or the row left out"
        for key, n in sorted(problems.found.items())
        if key not in counted
    ]
    lines += [
        f"{key}: values of the wrong shape (not what grpokit writes): shown as -"
        for key in sorted(problems.shapes)
        if key not in counted
    ]
    return lines
