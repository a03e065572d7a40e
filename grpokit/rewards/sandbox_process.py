"""The sandbox's process runner: start the sandbox's command in a new session with its rlimits, read its output
(capped) until it ends or its wall-clock limit passes, then kill its whole process tree; and the clean-up of the
work folders that killed reward workers leave behind. The isolation the command has is the concern of
:mod:`grpokit.rewards.sandbox`."""

from __future__ import annotations

import contextlib
import ctypes
import os
import resource
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

_PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class Limits:
    """What one sandboxed run may use. ``wall_seconds`` covers the whole run (every test of a program)."""

    wall_seconds: float = 30.0
    cpu_seconds: float = 10.0
    memory_mb: int = 1024
    processes: int = 32
    file_size_mb: int = 16
    open_files: int = 64
    output_bytes: int = 1 << 20


@dataclass
class Completed:
    """How a sandboxed run ended: its output (capped), exit status, and whether it was killed at the wall-clock
    limit (``timed_out``) or for printing more than ``output_bytes`` (``output_limited``)."""

    stdout: bytes
    stderr: bytes
    exit_code: int | None
    timed_out: bool = False
    output_limited: bool = False


def _processes_of(uid: int) -> int:
    """How many processes ``uid`` runs now: RLIMIT_NPROC counts them all, so the limit is this plus the sandbox's."""
    count = 0
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if entry.stat().st_uid == uid:
                    count += 1
    return count


BOX_PREFIX = "grpokit-box-"


def sweep_work_folders() -> list[str]:
    """Remove the work folders of processes that are gone (a reward worker killed at its timeout cannot remove its
    own); a folder is ``grpokit-box-<pid>-*`` in the temporary folder. Returns the folders removed."""
    removed = []
    root = tempfile.gettempdir()
    for name in os.listdir(root):
        pid = name[len(BOX_PREFIX) :].split("-", 1)[0]
        if name.startswith(BOX_PREFIX) and pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)
            removed.append(name)
    return removed


def _set_limits(limits: Limits, nproc: int | None) -> None:
    """In the child before exec (inherited by everything in the sandbox). It also dies with the thread that started
    it (PR_SET_PDEATHSIG): a reward worker killed at its timeout takes its sandboxes with it (bwrap's
    ``--die-with-parent`` and unshare's ``--kill-child`` carry that on to the program)."""
    if sys.platform == "linux":
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    mb = 1 << 20
    cpu = max(1, int(limits.cpu_seconds + 0.999))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    resource.setrlimit(resource.RLIMIT_AS, (limits.memory_mb * mb, limits.memory_mb * mb))
    resource.setrlimit(resource.RLIMIT_FSIZE, (limits.file_size_mb * mb, limits.file_size_mb * mb))
    resource.setrlimit(resource.RLIMIT_NOFILE, (limits.open_files, limits.open_files))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if nproc is not None:
        resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))


def _run(argv: list[str], stdin: bytes, limits: Limits, preexec, cwd: str, env: dict, hold_stdin: bool) -> Completed:
    """Run ``argv`` in a new session; read its stdout and stderr (capped at ``output_bytes`` each) until it ends or
    the wall-clock limit passes; then kill its whole process group, whatever happened."""
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=cwd,
        env=env,
        start_new_session=True,
        preexec_fn=preexec,
        close_fds=True,
    )
    deadline = time.monotonic() + limits.wall_seconds
    timed_out = limited = False
    out_fd, err_fd = proc.stdout.fileno(), proc.stderr.fileno()
    out = {out_fd: bytearray(), err_fd: bytearray()}
    try:
        with contextlib.suppress(BrokenPipeError):
            proc.stdin.write(stdin)
            proc.stdin.flush()
        if not hold_stdin:
            with contextlib.suppress(BrokenPipeError):
                proc.stdin.close()
        open_fds = set(out)
        while open_fds:
            left = deadline - time.monotonic()
            if left <= 0:
                timed_out = True
                break
            ready, _, _ = select.select(list(open_fds), [], [], left)
            for fd in ready:
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    open_fds.discard(fd)
                elif len(out[fd]) + len(chunk) > limits.output_bytes:
                    limited = True
                else:
                    out[fd] += chunk
            if limited:
                break
    finally:
        _kill_tree(proc)
    return Completed(
        stdout=bytes(out[out_fd]),
        stderr=bytes(out[err_fd]),
        exit_code=None if timed_out or limited else proc.returncode,
        timed_out=timed_out,
        output_limited=limited,
    )


def _kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL the sandbox's process group and reap it; then wait until the first process of its PID namespace has
    exited, which the kernel lets happen only once every other process in the namespace is gone.

    bwrap (``--as-pid-1``) and unshare (``--fork``) wait for that process themselves when it ends on its own; when
    they are killed it gets SIGKILL (``--die-with-parent``, ``--kill-child``) and ends after them."""
    inits = _children(proc.pid)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        proc.kill()
    proc.wait()
    for stream in (proc.stdin, proc.stdout, proc.stderr):
        with contextlib.suppress(BrokenPipeError):
            stream.close()
    deadline = time.monotonic() + _REAP_SECONDS
    while any(_alive(pid) for pid in inits) and time.monotonic() < deadline:
        time.sleep(0.01)


# How long a killed namespace may take to empty; the kernel does it at once, this only bounds a stuck machine.
_REAP_SECONDS = 30.0


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _alive(pid: int) -> bool:
    """The process exists and has not finished exiting (a zombie has)."""
    try:
        status = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return status.rpartition(")")[2].split()[0] != "Z"
