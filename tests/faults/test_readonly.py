"""A finished run on read-only storage: `grpokit inspect`, `report` and `eval` work and change nothing.

The rollout store is a WAL database, whose read-only connection needs its -shm file; on read-only storage there is
none and none can be made, so the store is opened as immutable, or from a private copy when its -wal file still
holds steps. report.html goes to the temporary folder, saying so (or where --output says). docs/reliability.md
lists these promises."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import can_mount, grpokit, kept, one_line, read_only, snapshot


@pytest.fixture()
def run(finished_run, tmp_path) -> Path:
    """A copy of the finished run (the tests mount over it)."""
    copy = tmp_path / "run"
    shutil.copytree(finished_run, copy)
    return copy


def store_files(run: Path) -> set[str]:
    return {p.name for p in run.glob("rollouts.sqlite*")}


@pytest.mark.parametrize("left_by_a_reader", [False, True], ids=["store-closed", "shm-and-wal-left"])
def test_inspect_report_and_eval_of_a_read_only_run(run, left_by_a_reader):
    """Both ways a finished run's store is found: closed by the trainer (no -shm, no -wal: SQLite's read-only mode
    alone cannot open it) and with the -shm and empty -wal a reader leaves behind (where `report` used to fail on
    report.html.tmp)."""
    if left_by_a_reader:
        assert grpokit("inspect", run).returncode == 0  # a reader on writable storage leaves -shm and -wal
        assert {"rollouts.sqlite-shm", "rollouts.sqlite-wal"} <= store_files(run)
    else:
        assert store_files(run) == {"rollouts.sqlite"}
    before = snapshot(run)
    with read_only(run) as env:
        summary = grpokit("inspect", run, "--json", env=env)
        query = grpokit("inspect", run, "--sql", "SELECT count(*) AS n FROM rollouts", "--json", env=env)
        report = grpokit("report", run, env=env)
        evaluation = grpokit("eval", run, env=env)
        assert kept(run, before)
    assert summary.returncode == 0, summary.stderr[-3000:]
    assert [row["step"] for row in json.loads(summary.stdout)] == [1, 2]
    assert query.returncode == 0 and json.loads(query.stdout) == [{"n": 8}], query.stderr[-3000:]
    line = one_line(report, 0)
    written = Path(report.stdout.strip().removeprefix("wrote "))
    assert line == (
        f"grpokit: {run / 'report.html'} cannot be written (Read-only file system); wrote the report to {written} "
        "instead (--output FILE chooses where)"
    )
    assert written.parent == Path(os.environ.get("TMPDIR", "/tmp")) and "<svg" in written.read_text()
    written.unlink()
    assert evaluation.returncode == 0, evaluation.stderr[-3000:]
    assert "Traceback" not in evaluation.stderr
    assert set(json.loads(evaluation.stdout)) >= {"eval/pass@1", "eval/reward"}


def test_report_output_option_and_a_refused_output(run, tmp_path):
    """--output writes where it says; --output into the read-only run is one line naming that file and the cause,
    and nothing is written anywhere."""
    before = snapshot(run)
    with read_only(run) as env:
        elsewhere = grpokit("report", run, "--output", tmp_path / "elsewhere.html", env=env)
        refused = grpokit("report", run, "--output", run / "mine.html", env=env)
        assert kept(run, before)
    assert elsewhere.returncode == 0 and "<svg" in (tmp_path / "elsewhere.html").read_text(), elsewhere.stderr
    assert one_line(refused, 2) == (
        f"grpokit: error: {run / 'mine.html'}: Read-only file system (EROFS); the file system is read-only; "
        "write to another folder"
    )


# A trainer killed by SIGKILL after committing a step leaves that step in the -wal file only; this writes such a
# store (step 3 in the WAL, never checkpointed into the main file) and dies the same way.
KILLED_WRITER = """
import os, sqlite3, sys, time
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("PRAGMA wal_autocheckpoint=0")
conn.execute("BEGIN")
conn.execute("INSERT INTO steps (step, written_at) VALUES (3, ?)", (time.time(),))
conn.execute("COMMIT")
os._exit(0)
"""


@pytest.mark.skipif(not can_mount(), reason="needs a real read-only mount: the simulation cannot stop SQLite")
def test_steps_still_in_the_wal_are_read_from_a_copy(run):
    """A store whose last step is only in its -wal file, on read-only storage without a -shm file: inspect reads
    a private copy (SQLite replays the WAL there), so step 3 is shown, and the run folder is unchanged.

    Skipped without mount rights: the hooks' simulated read-only storage lets SQLite write its -shm file, so
    there would be nothing to test."""
    store = run / "rollouts.sqlite"
    subprocess.run([sys.executable, "-c", KILLED_WRITER, str(store)], check=True)
    (run / "rollouts.sqlite-shm").unlink()
    assert (run / "rollouts.sqlite-wal").stat().st_size > 0
    with sqlite3.connect(f"{store.as_uri()}?immutable=1", uri=True) as db:  # the main file alone: steps 1 and 2
        assert [s for (s,) in db.execute("SELECT step FROM steps")] == [1, 2]
    before = snapshot(run)
    with read_only(run) as env:
        proc = grpokit("inspect", run, "--sql", "SELECT step FROM steps ORDER BY step", "--json", env=env)
        assert snapshot(run) == before
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout) == [{"step": 1}, {"step": 2}, {"step": 3}]
    assert "Traceback" not in proc.stderr
