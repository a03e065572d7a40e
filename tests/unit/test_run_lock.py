"""The run folder's lock: a second writer is refused naming the holder's PID and host; a lock whose holder died
(kill -9) is taken over; a forked child of the holder does not keep it alive."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from grpokit.system.run_lock import LOCK_FILE, RunFolderError, RunLock, check_unlocked

# Takes the lock of argv[1], prints "<pid> <child pid>" and waits. With argv[2] == "fork" it forks a child that
# sleeps, and the child prints the line: its fork handlers have then run (else, on a loaded machine, the test could
# kill the holder while the new child still holds the inherited descriptor).
HOLDER = """
import os, sys, time
from grpokit.system.run_lock import RunLock
RunLock(sys.argv[1]).acquire()
if sys.argv[2] != "fork":
    print(os.getpid(), 0, flush=True)
elif os.fork() == 0:
    print(os.getppid(), os.getpid(), flush=True)
    time.sleep(120)
    os._exit(0)
time.sleep(120)
"""


def start_holder(folder: Path, fork: bool = False) -> tuple[subprocess.Popen, int]:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(folder), "fork" if fork else "no"], stdout=subprocess.PIPE, text=True
    )
    pid, child = map(int, proc.stdout.readline().split())
    assert pid == proc.pid
    return proc, child


def kill(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)


def test_a_second_writer_is_refused_naming_the_holder_and_a_dead_holder_is_taken_over(tmp_path):
    run = tmp_path / "run"
    holder, _ = start_holder(run)
    try:
        expected = f"is in use by another grpokit run (PID {holder.pid} on host {socket.gethostname()} (since "
        with pytest.raises(RunFolderError, match=expected.replace("(", r"\(")):
            RunLock(run).acquire()
        with pytest.raises(RunFolderError, match=f"PID {holder.pid} "):
            check_unlocked(run)  # the check before a model loads
    finally:
        kill(holder)  # the kernel drops its lock; the file still names it
    assert (run / LOCK_FILE).read_text().split()[0] == str(holder.pid)
    check_unlocked(run)
    lock = RunLock(run).acquire()  # taken over
    assert (run / LOCK_FILE).read_text().split()[:2] == [str(os.getpid()), socket.gethostname()]
    check_unlocked(run)  # this process's own lock does not refuse it
    lock.release()
    assert (run / LOCK_FILE).exists()  # the folder was there before this lock: the file stays, naming the last writer


def test_a_folder_the_lock_made_goes_with_it_unless_something_was_written_there(tmp_path):
    RunLock(tmp_path / "refused").acquire().release()  # say, a resume whose checkpoint did not fit the model
    assert not (tmp_path / "refused").exists()
    lock = RunLock(tmp_path / "ran").acquire()
    (tmp_path / "ran" / "config.yaml").write_text("run: {}\n")
    lock.release()
    assert sorted(p.name for p in (tmp_path / "ran").iterdir()) == [LOCK_FILE, "config.yaml"]


def test_a_forked_child_does_not_keep_a_dead_holders_lock(tmp_path):
    """The holder forks (as reward workers are forked) and is killed; its child lives on, without the lock."""
    run = tmp_path / "run"
    holder, child = start_holder(run, fork=True)
    try:
        kill(holder)
        os.kill(child, 0)  # the child is alive
        RunLock(run).acquire().release()
    finally:
        os.kill(child, signal.SIGKILL)


def test_no_lock_file_is_created_by_the_check(tmp_path):
    check_unlocked(tmp_path / "none")
    assert not (tmp_path / "none").exists()
