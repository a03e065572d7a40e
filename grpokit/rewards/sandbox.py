"""Run model-written programs where they cannot touch the machine: the sandbox of the ``code`` reward.

Every program runs with

- no network (its own network namespace: only a loopback with nothing behind it);
- a read-only view of the system (``/usr`` and the interpreter's prefix) and nothing else of the host: not
  ``/etc``, ``/home``, ``/root``, ``/tmp`` or the project; a private, empty work folder (``/box``), removed after;
- its own PID namespace: it sees only its own processes, and when the sandbox ends the kernel kills them all
  (a daemon started with ``setsid`` included);
- rlimits on CPU time, address space (memory), processes, file size and open files, as an unprivileged user
  (``nobody`` when grpokit runs as root, whose processes the kernel would not count);
- a wall-clock limit, past which the whole process tree is killed, and a cap on the output read back.

Backends, chosen by :func:`choose_backend`: ``bwrap`` (bubblewrap, where installed and working), else
``unshare`` (util-linux: network, PID, mount, IPC and UTS namespaces; the harness then hides ``/tmp``, ``/home``,
``/root``, ``/etc`` and ``/var`` under empty tmpfs and makes the rest read-only). Where neither works the ``code``
reward refuses to run, with one line naming the fix (:class:`SandboxUnavailable`). ``none`` is the explicit,
loudly warned opt-out: rlimits and the wall-clock kill of the process group only.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import resource
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

from grpokit.rewards.contract import RewardError

BACKENDS = ("auto", "bwrap", "unshare", "none")
WORK = "/box"  # the private work folder, as the program sees it
NOBODY = 65534
_PR_SET_PDEATHSIG = 1
FIX = (
    "install bubblewrap (apt-get install bubblewrap) or allow user namespaces (sysctl "
    "kernel.unprivileged_userns_clone=1, or run as root), or set sandbox: none to run model-written code on this "
    "machine without isolation (dangerous)"
)


class SandboxUnavailable(RewardError):
    """No isolation works on this machine; the message names the fix."""


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


def _bwrap_root_args() -> list[str]:
    """The read-only system: ``/usr`` and the top-level folders or merged-/usr links beside it."""
    args: list[str] = []
    for top in ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
    return args


def _interpreter() -> tuple[str, str]:
    """The plain interpreter (outside any virtualenv: programs see only the standard library) and its prefix."""
    python = os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)
    return python, os.path.realpath(sys.base_prefix)


def _processes_of(uid: int) -> int:
    """How many processes ``uid`` runs now: RLIMIT_NPROC counts them all, so the limit is this plus the sandbox's."""
    count = 0
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if entry.stat().st_uid == uid:
                    count += 1
    return count


class Sandbox:
    """Runs one command at a time in a fresh sandbox (see the module docstring); thread-safe.

    ``backend``: auto | bwrap | unshare | none. ``readonly``: more host folders to show read-only (a
    compiler's or runtime's install folder, for a language other than Python).
    """

    def __init__(self, backend: str = "auto", readonly: tuple[str, ...] = ()):
        if backend not in BACKENDS:
            raise ValueError(f"sandbox must be one of {', '.join(BACKENDS)}, got {backend!r}")
        self.python, self.prefix = _interpreter()
        self.readonly = tuple(os.path.realpath(p) for p in readonly)
        self.root = os.geteuid() == 0
        # the uid programs run as: nobody when grpokit is root (the kernel never counts root's processes)
        self.uid = NOBODY if self.root else os.getuid()
        self.backend = choose_backend(backend, self)
        if self.backend == "none":
            warnings.warn(
                "grpokit: sandbox: none runs model-written code on this machine WITHOUT isolation: it can read and "
                "write your files, use the network and start processes that outlive the run. Only rlimits and a "
                "wall-clock kill apply.",
                stacklevel=3,
            )

    def argv(self, command: list[str], work: str) -> list[str]:
        """The full command line that runs ``command`` (paths inside the sandbox) with ``work`` as /box."""
        if self.backend == "bwrap":
            unshare = (
                ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try"]
                if self.root
                else ["--unshare-all"]
            )
            caps = ["--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"] if self.root else []
            binds = _bwrap_root_args()
            for path in (self.prefix, *self.readonly):
                if not path.startswith("/usr/"):
                    # its parents as folders anyone may cross (the host's may not be: /root is 0700)
                    for parent in reversed(Path(path).parents[:-1]):
                        binds += ["--perms", "0755", "--dir", str(parent)]
                    binds += ["--ro-bind", path, path]
            return [
                "bwrap",
                *unshare,
                "--as-pid-1",  # the command is the namespace's init: when it has exited, so has every process in it
                "--die-with-parent",
                "--new-session",
                "--hostname",
                "sandbox",
                *caps,
                *binds,
                "--proc",
                "/proc",
                "--dev",
                "/dev",
                "--tmpfs",
                "/tmp",
                "--bind",
                work,
                WORK,
                "--chdir",
                WORK,
                "--clearenv",
                "--setenv",
                "PATH",
                "/usr/local/bin:/usr/bin:/bin",
                "--setenv",
                "HOME",
                WORK,
                "--setenv",
                "LANG",
                "C.UTF-8",
                "--",
                *command,
            ]
        if self.backend == "unshare":
            user = [] if self.root else ["--user", "--map-root-user"]
            return [
                "unshare",
                *user,
                "--net",
                "--pid",
                "--fork",
                "--kill-child",
                "--mount",
                "--mount-proc",
                "--ipc",
                "--uts",
                "--",
                *command,
            ]
        return list(command)

    def in_sandbox(self, path: str, work: str) -> str:
        """Where the host's ``path`` under the work folder is seen by the program."""
        return path.replace(work, WORK, 1) if self.backend == "bwrap" else path

    def run(
        self, command: list[str], stdin: bytes, files: dict[str, str], limits: Limits, hold_stdin: bool = False
    ) -> Completed:
        """Write ``files`` into a fresh work folder, run ``command`` there (``{work}`` in an argument is the
        folder as the program sees it) with ``stdin``, and return how it ended; the folder is removed after.
        ``hold_stdin``: keep stdin open until the run ends, as a lifeline: the program sees EOF when this process
        dies (a reward worker killed at its timeout), which the code reward's harness obeys at once. (The kernel's
        parent-death signal cannot serve: it is not sent across users, and the program runs as another.)"""
        sweep_work_folders()
        work = tempfile.mkdtemp(prefix=f"{BOX_PREFIX}{os.getpid()}-")
        try:
            for name, text in files.items():
                Path(work, name).write_text(text)
            if self.root:  # the program's user owns it; root without capabilities (bwrap's start) may only enter it
                os.chown(work, self.uid, self.uid)
                os.chmod(work, 0o711)
            seen = self.in_sandbox(work, work)
            command = [arg.replace("{work}", seen) for arg in command]
            env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": seen, "LANG": "C.UTF-8"}
            return _run(self.argv(command, work), stdin, limits, self._limit_setter(limits), work, env, hold_stdin)
        finally:
            shutil.rmtree(work, ignore_errors=True)

    def _limit_setter(self, limits: Limits):
        nproc = None if self.root else _processes_of(self.uid) + limits.processes + 4  # + the sandbox's own
        return functools.partial(_set_limits, limits, nproc)

    def nproc_for_program(self, limits: Limits) -> int | None:
        """RLIMIT_NPROC the harness sets after dropping to ``nobody`` (root only): that uid's processes now plus
        the sandbox's allowance."""
        return _processes_of(self.uid) + limits.processes if self.root else None


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


_PROBE = (
    "import socket\ntry:\n    socket.create_connection(('10.255.255.1', 9), 0.5)\n"
    "except OSError:\n    print('isolated')\n"
)


@functools.cache
def _works(backend: str, root: bool) -> str | None:
    """None when ``backend`` runs a probe here with the network cut, else why not (cached per process)."""
    if backend == "bwrap" and shutil.which("bwrap") is None:
        return "bwrap is not installed"
    if backend == "unshare" and shutil.which("unshare") is None:
        return "unshare is not installed"
    probe = Sandbox.__new__(Sandbox)
    probe.python, probe.prefix = _interpreter()
    probe.readonly, probe.root, probe.backend = (), root, backend
    probe.uid = NOBODY if root else os.getuid()
    try:
        done = probe.run([probe.python, "-I", "-S", "-c", _PROBE], b"", {}, Limits(wall_seconds=20))
    except OSError as exc:
        return str(exc)
    if done.stdout.strip() != b"isolated":
        return (done.stderr.decode(errors="replace").strip().splitlines() or ["it did not run"])[-1]
    return None


def choose_backend(backend: str, sandbox: Sandbox) -> str:
    """``backend`` checked to work here (``auto``: bwrap, else unshare); :class:`SandboxUnavailable` otherwise."""
    if backend == "none":
        return "none"
    candidates = ("bwrap", "unshare") if backend == "auto" else (backend,)
    reasons = []
    for candidate in candidates:
        why = _works(candidate, sandbox.root)
        if why is None:
            return candidate
        reasons.append(f"{candidate}: {why}")
    raise SandboxUnavailable(
        f"the code reward runs model-written programs only in a sandbox, and none works here ({'; '.join(reasons)}): "
        + FIX
    )
