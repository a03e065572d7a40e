"""Run model-written programs where they cannot touch the machine: the sandbox of the ``code`` reward.

Every program runs with

- no network (its own network namespace: only a loopback with nothing behind it);
- a read-only view of the system (``/usr`` and the interpreter's prefix) and nothing else of the host: not
  ``/etc``, ``/home``, ``/root``, ``/tmp`` or the project; a private, empty work folder (``/box``), removed after;
- a minimal ``/dev`` (null, zero, random, urandom from the host; an empty, private ``/dev/shm``): not the host's;
- no capabilities (bounding, ambient, inheritable, permitted and effective sets all empty), ``no_new_privs`` (a
  setuid binary runs as its caller) and a harness that cannot be ptraced; mounts it cannot undo;
- its own PID namespace: it sees only its own processes, and when the sandbox ends the kernel kills them all
  (a daemon started with ``setsid`` included);
- rlimits on CPU time, address space (memory), processes, file size and open files, as an unprivileged user
  (``nobody`` when grpokit runs as root, whose processes the kernel would not count);
- a wall-clock limit, past which the whole process tree is killed, and a cap on the output read back.

Backends, chosen by :func:`choose_backend`: ``bwrap`` (bubblewrap, where installed and working), else
``unshare`` (util-linux: network, PID, mount, IPC and UTS namespaces; the harness, ``code_harness.py``, then hides
``/tmp``, ``/home``, ``/root``, ``/etc`` and ``/var`` under empty tmpfs, makes the rest read-only and, as an
ordinary user, locks that view by entering a further user and mount namespace). Both are probed with the harness
itself: a backend whose view cannot be locked or whose capabilities cannot be dropped is refused, never used.
Where neither works the ``code`` reward refuses to run, with one line naming the fix (:class:`SandboxUnavailable`).
``none`` is the explicit, loudly warned opt-out: rlimits and the wall-clock kill of the process group only.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any

from grpokit.rewards.contract import RewardError
from grpokit.rewards.sandbox_process import (
    BOX_PREFIX,
    Completed,
    Limits,
    _alive,
    _processes_of,
    _run,
    _set_limits,
    sweep_work_folders,
)

__all__ = ["BOX_PREFIX", "Completed", "Limits", "Sandbox", "SandboxUnavailable", "_alive", "sweep_work_folders"]

BACKENDS = ("auto", "bwrap", "unshare", "none")
WORK = "/box"  # the private work folder, as the program sees it
NOBODY = 65534
HARNESS = Path(__file__).with_name("code_harness.py")  # runs inside the sandbox: isolates it, then the tests
SHM_BYTES = 16 << 20  # the private /dev/shm's size
TMP_BYTES = 64 << 20  # the private /tmp's size
FIX = (
    "install bubblewrap (apt-get install bubblewrap) or allow user namespaces, nested ones included (sysctl "
    "kernel.unprivileged_userns_clone=1 and user.max_user_namespaces > 0, or run as root), or set sandbox: none to "
    "run model-written code on this machine without isolation (dangerous)"
)


class SandboxUnavailable(RewardError):
    """No isolation works on this machine; the message names the fix (``why``: what failed, when known)."""

    why = ""


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
                # its own user namespace, in which the program cannot make another (bwrap >= 0.8)
                else ["--unshare-all", "--unshare-user", "--disable-userns"]
            )
            # as root: what the harness needs to become nobody and empty the bounding set, which it then does
            caps = ["--cap-drop", "ALL"] + [
                a for c in ("SETUID", "SETGID", "SETPCAP") for a in ("--cap-add", f"CAP_{c}")
            ]
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
                *(caps if self.root else []),
                *binds,
                "--proc",
                "/proc",
                "--dev",  # a fresh tmpfs: null, zero, full, random, urandom, tty, a private devpts and shm
                "/dev",
                *("--perms", "01777", "--size", str(SHM_BYTES), "--tmpfs", "/dev/shm"),
                *("--size", str(TMP_BYTES), "--tmpfs", "/tmp"),
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

    def inside(self, limits: Limits) -> dict[str, Any]:
        """What the harness does inside the sandbox before any test (its spec's isolation keys): ``keep``, the
        folders the ``unshare`` view shows; ``lock``, the uid and gid the program has once that view is locked (an
        ordinary user's ``unshare``); ``harden``, drop every capability and set no_new_privs; ``uid``, the user
        to become (root); ``processes``, RLIMIT_NPROC then."""
        sandboxed = self.backend != "none"
        return {
            "keep": [self.prefix, *self.readonly] if self.backend == "unshare" else None,
            "lock": {"uid": os.getuid(), "gid": os.getgid()} if self.backend == "unshare" and not self.root else None,
            "harden": sandboxed,
            "uid": self.uid if self.root and sandboxed else None,
            "processes": self.nproc_for_program(limits) if sandboxed else None,
        }

    def run_harness(self, spec: dict[str, Any], limits: Limits, label: str = "") -> tuple[dict | None, Completed]:
        """Run the harness on ``spec`` (its tests; the isolation keys are added here) and return its JSON reply (None
        when it gave none) and how the run ended. :class:`SandboxUnavailable` when the harness refused to run any
        test because this sandbox could not be isolated (a view not locked, a capability not dropped)."""
        command = [self.python, "-I", "-S", "{work}/harness.py", *([label] if label else [])]
        line = json.dumps({**spec, **self.inside(limits)}).encode() + b"\n"
        done = self.run(command, line, {"harness.py": HARNESS.read_text()}, limits, hold_stdin=True)
        try:
            reply = json.loads(done.stdout.decode().strip().splitlines()[-1])
        except (ValueError, IndexError):
            return None, done
        if isinstance(reply, dict) and "refused" in reply:
            error = SandboxUnavailable(
                f"the {self.backend} sandbox cannot isolate programs here ({reply['refused']}): {FIX}"
            )
            error.why = f"cannot isolate programs: {reply['refused']}"
            raise error
        return (reply if isinstance(reply, dict) else None), done


_PROBE = (
    "import socket\ntry:\n    socket.create_connection(('10.255.255.1', 9), 0.5)\n"
    "except OSError:\n    print('isolated')\n"
)


@functools.cache
def _works(backend: str, root: bool) -> str | None:
    """None when ``backend`` runs the harness here, isolated (its view locked, no capabilities) and with the network
    cut, else why not (cached per process)."""
    if backend == "bwrap" and shutil.which("bwrap") is None:
        return "bwrap is not installed"
    if backend == "unshare" and shutil.which("unshare") is None:
        return "unshare is not installed"
    probe = Sandbox.__new__(Sandbox)
    probe.python, probe.prefix = _interpreter()
    probe.readonly, probe.root, probe.backend = (), root, backend
    probe.uid = NOBODY if root else os.getuid()
    spec = {"program": _PROBE, "tests": [{"stdin": "", "stdout": "isolated"}], "test_seconds": 10.0}
    try:
        reply, done = probe.run_harness({**spec, "output_bytes": 4096, "command": None}, Limits(wall_seconds=20))
    except OSError as exc:
        return str(exc)
    except SandboxUnavailable as exc:
        return exc.why
    if reply is None or reply.get("results") != ["passed"]:
        lines = done.stderr.decode(errors="replace").strip().splitlines()
        return (lines or [f"the probe did not pass: {reply}"])[-1]
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
