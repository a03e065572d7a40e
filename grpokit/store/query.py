"""A user's ad-hoc SQL on a run's store (`grpokit inspect --sql`): one SELECT (or WITH ... SELECT) on a connection
whose authorizer refuses anything but reading, so neither a write nor a PRAGMA gets through a crafted statement."""

from __future__ import annotations

import re
import sqlite3

from grpokit.store.errors import QueryError

_LEADING_COMMENTS = re.compile(r"^(?:\s+|--[^\n]*(?:\n|$)|/\*.*?\*/)*", re.DOTALL)
# What a read-only query may do: read tables and views, call functions, recurse in a CTE.
_QUERY_ACTIONS = {sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_FUNCTION, sqlite3.SQLITE_RECURSIVE}


def check_query(sql: str) -> None:
    """A QueryError unless ``sql`` starts (after comments) with SELECT or WITH."""
    body = _LEADING_COMMENTS.sub("", sql)
    first_word = body.split(None, 1)[0].lower() if body.strip() else ""
    if first_word not in ("select", "with"):
        raise QueryError("only a single SELECT (or WITH ... SELECT) query is allowed")


def reading_only(conn: sqlite3.Connection) -> sqlite3.Connection:
    """``conn`` with an authorizer that refuses every action but reading. The JSON table-valued functions are opened
    first: SQLite declares ``json_each`` and ``json_tree`` on their first use in a connection by parsing a CREATE
    TABLE, which the authorizer would see as a write of ``sqlite_master`` and refuse ("vtable constructor failed")."""
    conn.execute("SELECT 1 FROM json_each('[]'), json_tree('[]')").fetchall()
    conn.set_authorizer(lambda action, *_: sqlite3.SQLITE_OK if action in _QUERY_ACTIONS else sqlite3.SQLITE_DENY)
    return conn


def run_query(conn: sqlite3.Connection, sql: str) -> tuple[list[str], list[tuple]]:
    """(columns, rows) of the read-only query ``sql`` on ``conn`` (made by :func:`reading_only`)."""
    check_query(sql)
    try:
        cursor = conn.execute(sql)
        rows = cursor.fetchall()
    except sqlite3.ProgrammingError as err:
        raise QueryError(f"only a single SELECT query is allowed ({err})") from err
    except sqlite3.DatabaseError as err:
        if "not authorized" in str(err):
            raise QueryError(
                "only read-only queries are allowed (the query tried to write or change a setting)"
            ) from err
        raise QueryError(f"query failed: {err}") from err
    return [d[0] for d in cursor.description], rows
