"""A writer killed with SIGKILL mid-run leaves a sound store holding whole steps 1..k."""

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

import grpokit
from grpokit.store import RolloutStore

ROLLOUTS_PER_STEP = 64

# Resumes after the store's last step, like a trainer restarted from its latest state, and
# reports each committed step on stdout.
WRITER = f"""
import sys
from grpokit.store import RolloutRecord, RolloutStore

store = RolloutStore(sys.argv[1])
rows = [RolloutRecord(prompt_index=i // 8, completion_index=i % 8, prompt="p" * 200,
             completion="c" * 1000, prompt_tokens=50, completion_tokens=250,
             finish_reason="stop", rewards={{"a": 1.0, "b": 0.0, "c": None}}, reward=1.0,
             advantage=0.5, policy_version=0, error=None) for i in range({ROLLOUTS_PER_STEP})]
step = store.last_step()
while True:
    step += 1
    store.write_step(step, rows, {{"kl": float(step), "entropy": 1.0}})
    print(step, flush=True)
"""


def start_writer(db: Path) -> subprocess.Popen:
    repo = str(Path(grpokit.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (repo, os.environ.get("PYTHONPATH")) if p)}
    return subprocess.Popen([sys.executable, "-c", WRITER, str(db)], stdout=subprocess.PIPE, text=True, env=env)


def kill_after(writer: subprocess.Popen, committed_steps: int, delay: float) -> int:
    """SIGKILL the writer `delay` s after it reports `committed_steps` more steps.

    Returns the last step it reported, including reports still in the pipe at the kill.
    """
    reported = []
    for _ in range(committed_steps):
        line = writer.stdout.readline()
        assert line, "the writer died before it was killed"
        reported.append(int(line))
    time.sleep(delay)  # lands the kill at varying points of a write_step
    writer.send_signal(signal.SIGKILL)
    writer.wait(timeout=30)
    assert writer.returncode == -signal.SIGKILL
    # The writer runs ahead of this reader; what it reported is still buffered in the pipe.
    reported += map(int, writer.stdout.read().split())
    writer.stdout.close()
    return reported[-1]


def assert_whole_steps(db: Path, at_least: int) -> int:
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        steps = [s for (s,) in conn.execute("SELECT step FROM steps ORDER BY step")]
        per_step = dict(conn.execute("SELECT step, count(*) FROM rollouts GROUP BY step"))
        metrics = dict(conn.execute("SELECT step, count(*) FROM step_metrics GROUP BY step"))
    k = len(steps)
    # Every reported step was committed; at most the one being written when killed came after.
    assert at_least <= k <= at_least + 1
    assert steps == list(range(1, k + 1))
    assert per_step == {s: ROLLOUTS_PER_STEP for s in steps}
    assert metrics == {s: 2 for s in steps}
    return k


def test_sigkill_mid_run_leaves_whole_steps(tmp_path):
    db = tmp_path / "run" / "rollouts.sqlite"
    k = 0
    # Kill, check, resume: three crashes at different moments of a write.
    for more_steps, delay in ((20, 0.0), (15, 0.002), (10, 0.007)):
        last = kill_after(start_writer(db), more_steps, delay)
        assert last >= k + more_steps
        k = assert_whole_steps(db, at_least=last)
    with RolloutStore(db) as store:
        assert store.last_step() == k
        assert store.metrics()[-1] == {"step": k, "entropy": 1.0, "kl": float(k)}


@pytest.mark.parametrize("mode", ["readonly", "writable"])
def test_store_opens_after_a_crash(tmp_path, mode):
    db = tmp_path / "run" / "rollouts.sqlite"
    last = kill_after(start_writer(db), 5, 0.001)
    with RolloutStore(db, readonly=mode == "readonly") as store:
        assert store.steps()[:last] == list(range(1, last + 1))
        assert len(store.rollouts(step=last)) == ROLLOUTS_PER_STEP
