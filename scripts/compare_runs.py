"""Compare the run folders two test sessions left (pytest --basetemp), run by run: metrics.jsonl with timing keys
removed and every table of rollouts.sqlite less its wall-clock columns. A refactor that should change no number is
checked with it (docs/testing.md, "numbers unchanged"). A test server's loopback port (new each run) reads as PORT:

    python scripts/compare_runs.py BEFORE_BASETEMP AFTER_BASETEMP

Run folders are matched by their path under the basetemp (pytest names them by test). Prints each difference and
``runs: N, differences: D``; exits 1 when D > 0 or no run folder matched.

``--added-ok``: what a feature added since BEFORE (a metric key, a table, a key/value row no BEFORE run has) is
listed once as added and left out of the comparison; every value BEFORE had must still be equal::

    python scripts/compare_runs.py --added-ok BEFORE_BASETEMP AFTER_BASETEMP
"""

from __future__ import annotations

import json
import re
import sqlite3
import sys
from pathlib import Path

# wall times, and what differs between two runs of the same numbers as they do (memory: a process's peak)
TIMING = re.compile(
    r"(^time/|_time$|_seconds$|/seconds$|per_second|runtime|^step_time|latency|_wait|/wait|elapsed|^memory/)"
)
KEY_COLUMNS = {"meta": "key", "step_metrics": "name"}  # key/value tables: the column that names a row
CLOCK_COLUMNS = {"written_at", "created", "start", "duration", "started_at", "finished_at"}


def metrics(run: Path) -> list[dict]:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if not TIMING.search(k)} for line in lines if line.strip()]


def tables(run: Path) -> dict[str, list[dict]]:
    path = run / "rollouts.sqlite"
    if not path.exists():
        return {}
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
        names = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table' ORDER BY name")]
        out = {}
        for name in names:
            columns = [r[1] for r in db.execute(f"PRAGMA table_info({name})")]
            keep = [c for c in columns if c not in CLOCK_COLUMNS and not TIMING.search(c)]
            if not keep:
                continue
            rows = db.execute(f"SELECT {', '.join(keep)} FROM {name} ORDER BY rowid").fetchall()
            key = keep.index(KEY_COLUMNS[name]) if KEY_COLUMNS.get(name) in keep else None
            if key is not None:  # a key/value table: a row named by a clock or a timing is left out
                rows = [row for row in rows if not (row[key] in CLOCK_COLUMNS or TIMING.search(str(row[key])))]
            # by column name, NULLs left out: a column one side lacks reads as NULL (added later), as a table does
            out[name] = [{c: _untimed(v) for c, v in zip(keep, row) if v is not None} for row in rows]
        return out


LOOPBACK_PORT = re.compile(r"(127\.0\.0\.1|localhost):\d+")  # a test server's port, new each run


def _untimed(value):
    """A JSON column (metrics of a step, a turn's record) without its timing keys; a loopback port as PORT."""
    if isinstance(value, str):
        value = LOOPBACK_PORT.sub(r"\1:PORT", value)
    if isinstance(value, str) and value[:1] in "{[":
        try:
            data = json.loads(value)
        except ValueError:
            return value
        return json.dumps(_strip(data), sort_keys=True)
    return value


def _strip(data):
    if isinstance(data, dict):
        return {k: _strip(v) for k, v in data.items() if not TIMING.search(k) and k not in CLOCK_COLUMNS}
    if isinstance(data, list):
        return [_strip(v) for v in data]
    return data


def run_folders(base: Path) -> dict[str, Path]:
    return {str(p.parent.relative_to(base)): p.parent for p in base.rglob("metrics.jsonl")}


def added_since(runs: list[Path]) -> tuple[set[str], set[str], dict[str, set]]:
    """What the BEFORE runs have: metric keys, tables, and the row names of each key/value table."""
    keys, names, rows = set(), set(), {}
    for run in runs:
        for line in metrics(run):
            keys |= set(line)
        for table, content in tables(run).items():
            names.add(table)
            column = KEY_COLUMNS.get(table)
            if column:
                rows.setdefault(table, set()).update(row.get(column) for row in content)
    return keys, names, rows


def _known(run: Path, keys: set[str], names: set[str], rows: dict[str, set], added: set[str]):
    """``run``'s metrics and tables less what BEFORE never had (each noted in ``added``)."""
    lines = []
    for line in metrics(run):
        added.update(f"metric {k}" for k in line if k not in keys)
        lines.append({k: v for k, v in line.items() if k in keys})
    kept = {}
    for table, content in tables(run).items():
        if table not in names:
            added.add(f"table {table}")
            continue
        column = KEY_COLUMNS.get(table)
        if column:
            added.update(f"{table} row {r.get(column)}" for r in content if r.get(column) not in rows[table])
            content = [r for r in content if r.get(column) in rows[table]]
        kept[table] = content
    return lines, kept


def main(argv: list[str]) -> int:
    added_ok = "--added-ok" in argv
    before, after = (Path(a) for a in argv if a != "--added-ok")
    runs_before, runs_after = run_folders(before), run_folders(after)
    known = added_since(list(runs_before.values())) if added_ok else None
    added: set[str] = set()
    common = sorted(set(runs_before) & set(runs_after))
    differences = 0
    for name in sorted(set(runs_before) ^ set(runs_after)):
        print(f"only in {'before' if name in runs_before else 'after'}: {name}")
        differences += 1
    for name in common:
        a, b = runs_before[name], runs_after[name]
        ma, ta = metrics(a), tables(a)
        mb, tb = _known(b, *known, added) if known else (metrics(b), tables(b))
        if ma != mb:
            print(f"{name}: metrics.jsonl differs")
            differences += 1
        for table in sorted(set(ta) | set(tb)):
            if ta.get(table, []) != tb.get(table, []):  # a table one side lacks reads as empty (added later)
                print(f"{name}: table {table} differs")
                differences += 1
    for what in sorted(added):
        print(f"added since before (not compared): {what}")
    print(f"runs: {len(common)}, differences: {differences}")
    return 1 if differences or not common else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
