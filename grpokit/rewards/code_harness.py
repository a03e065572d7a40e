"""The test harness of the ``code`` reward: runs INSIDE the sandbox (``python -I -S code_harness.py < spec``).

It imports nothing from grpokit (the sandbox cannot see grpokit's files) and only the standard library. It reads
one JSON spec, a line on stdin, which the caller then holds open (EOF: the caller died, and the sandbox ends with
this process, its namespace's first), runs each test in a forked child (its own process group, the per-test time
limit, its output read through a pipe and capped) and prints one JSON line: each test's result. A test passes only
when its child writes the harness's token after the test: a program that exits early (``os._exit(0)``) fails.

Spec: ``{"program": str, "tests": [{"assert": str} | {"stdin": str, "stdout": str}], "test_seconds": float,
"output_bytes": int, "command": [str] | null, "uid": int | null, "processes": int | null, "keep": [str] | null}``
(``keep``: the ``unshare`` backend, whose harness hides the file system itself, showing only these folders). With
``command`` (a language other than Python) each stdin/stdout test runs that command on ``./program``.
"""

import contextlib
import json
import os
import resource
import secrets
import select
import signal
import sys
import time

SHOWN = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/proc")
DEVICES = ("null", "zero", "random", "urandom")  # the minimal /dev: these, bound from the host, and an empty shm
RDONLY, NOSUID, NODEV, NOEXEC, REMOUNT, BIND, REC, PRIVATE = 1, 2, 4, 8, 32, 4096, 16384, 1 << 18
CLONE_NEWNS, CLONE_NEWUSER = 0x20000, 0x10000000


class Refused(Exception):
    """The sandbox cannot be made safe here: the caller refuses the backend (the message says which step)."""


def libc():
    import ctypes

    return ctypes.CDLL(None, use_errno=True)


def call(result, what):
    import ctypes

    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def mount(source, target, fstype, flags, data=None):
    encoded = [None if x is None else x.encode() for x in (source, target, fstype, data)]
    call(libc().mount(encoded[0], encoded[1], encoded[2], flags, encoded[3]), "mount " + target)


def readonly(point, options):
    flags = sum(
        flag for option, flag in (("nosuid", NOSUID), ("nodev", NODEV), ("noexec", NOEXEC)) if option in options
    )
    mount("none", point, None, REMOUNT | BIND | RDONLY | flags)


def private_view(keep):
    """The ``unshare`` backend (bwrap does this itself): in this process's new mount namespace, hide every top-level
    folder but the system's under an empty tmpfs, show ``keep`` (the interpreter's prefix) again, give it a minimal
    /dev, make every mount but /proc read-only (/proc: see :func:`lock_view`), and work in a fresh tmpfs on /tmp."""
    mount("none", "/", None, REC | PRIVATE)
    fds = [(path, os.open(path, os.O_PATH)) for path in keep]
    devices = [(name, os.open("/dev/" + name, os.O_PATH)) for name in DEVICES]
    for name in os.listdir("/"):
        path = "/" + name
        if path not in SHOWN and os.path.isdir(path) and not os.path.islink(path):
            mount("tmpfs", path, "tmpfs", NOSUID | NODEV, "size=1m,mode=755")
    for path, fd in fds:
        os.makedirs(path, exist_ok=True)
        mount(f"/proc/self/fd/{fd}", path, None, BIND | REC)
        os.close(fd)
    for name, fd in devices:  # /dev is one of the empty tmpfs above: the host's (and its /dev/shm) are hidden
        open("/dev/" + name, "w").close()
        mount(f"/proc/self/fd/{fd}", "/dev/" + name, None, BIND)
        os.close(fd)
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "0"), ("stdout", "1"), ("stderr", "2")):
        os.symlink(target if name == "fd" else "/proc/self/fd/" + target, "/dev/" + name)
    os.mkdir("/dev/shm")
    with open("/proc/self/mountinfo") as f:
        points = [(line.split()[4], line.split()[5].split(",")) for line in f]
    for point, options in points:
        if point != "/proc" and not point.startswith("/proc/"):
            # a mount that cannot change (locked, gone) stays as the host has it, hidden or read-only above
            with contextlib.suppress(OSError):
                readonly(point, options)
    mount("tmpfs", "/dev/shm", "tmpfs", NOSUID | NODEV | NOEXEC, "size=16m,mode=1777")
    mount("tmpfs", "/tmp", "tmpfs", NOSUID | NODEV, "size=64m,mode=1777")
    os.chdir("/tmp")


def limit_user_namespaces():
    """Before :func:`lock_view` (this user namespace is the sandbox's own): let it hold one more user namespace,
    the lock's, so the program cannot make another (where it would hold every capability again)."""
    with open("/proc/sys/user/max_user_namespaces", "w") as f:
        f.write("1")


def lock_view(ids):
    """The ``unshare`` backend as an ordinary user: the view above was built by this process as root of its own
    user namespace, so the program could undo it (unmount the tmpfs layers, remount / read-write). Enter a further
    user and mount namespace: every mount copied into a mount namespace of a less privileged user namespace is
    locked by the kernel (MNT_LOCKED: not unmounted alone, its read-only and other flags fixed), whatever
    capabilities the program holds there. ``ids``: the uid and gid the program then has (the invoking user's)."""
    uid, gid = os.getuid(), os.getgid()
    call(libc().unshare(CLONE_NEWUSER | CLONE_NEWNS), "a second user namespace")
    for name, text in (
        ("setgroups", "deny"),
        ("uid_map", f"{ids['uid']} {uid} 1"),
        ("gid_map", f"{ids['gid']} {gid} 1"),
    ):
        with open("/proc/self/" + name, "w") as f:
            f.write(text)
    with open("/proc/self/mountinfo") as f:
        proc = [line.split()[5].split(",") for line in f if line.split()[4] == "/proc"]
    readonly("/proc", proc[-1])


def status_fields():
    with open("/proc/self/status") as f:
        return dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)


def drop_privileges(uid, processes):
    """Every capability gone (bounding, ambient, inheritable, permitted, effective), no new privileges (a setuid
    binary runs as its caller), not dumpable (the program cannot ptrace this harness); as root: the user ``uid``."""
    import ctypes

    lib = libc()
    with open("/proc/sys/kernel/cap_last_cap") as f:
        last = int(f.read())
    for cap in range(last + 1):
        if lib.prctl(23, cap, 0, 0, 0) == 1:  # PR_CAPBSET_READ
            call(lib.prctl(24, cap, 0, 0, 0), f"drop capability {cap} from the bounding set")  # PR_CAPBSET_DROP
    call(lib.prctl(47, 4, 0, 0, 0), "clear the ambient capabilities")  # PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL
    if uid is not None and os.getuid() == 0:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    data = (ctypes.c_uint32 * 6)()  # effective, permitted, inheritable: two 32-bit words each, all zero
    call(lib.capset(ctypes.byref(Header(0x20080522, 0)), data), "clear the capabilities")  # _LINUX_CAPABILITY_VERSION_3
    call(lib.prctl(38, 1, 0, 0, 0), "set no_new_privs")  # PR_SET_NO_NEW_PRIVS
    call(lib.prctl(4, 0, 0, 0, 0), "make the harness not dumpable")  # PR_SET_DUMPABLE
    # a change of user clears the parent-death signal that bwrap (--die-with-parent) and unshare (--kill-child)
    # set: set it again, so this namespace dies with them
    call(lib.prctl(1, signal.SIGKILL, 0, 0, 0), "set the parent-death signal")  # PR_SET_PDEATHSIG
    fields = status_fields()
    held = [
        f"{key} {fields.get(key)}"
        for key in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")
        if int(fields.get(key, "1"), 16)
    ]
    if held or fields.get("NoNewPrivs") != "1":
        raise Refused(
            "capabilities left after dropping them: "
            + ", ".join([*held, "NoNewPrivs " + str(fields.get("NoNewPrivs"))])
        )
    if processes is not None:
        resource.setrlimit(resource.RLIMIT_NPROC, (processes, processes))


def isolate(spec):
    """Everything this harness does to the sandbox before any program runs; :class:`Refused` when a step fails."""
    try:
        if spec.get("lock") is not None:
            limit_user_namespaces()
        if spec.get("keep") is not None:
            private_view(spec["keep"])
        if spec.get("lock") is not None:
            lock_view(spec["lock"])
        if spec.get("harden"):
            drop_privileges(spec.get("uid"), spec.get("processes"))
        elif spec.get("processes") is not None:
            resource.setrlimit(resource.RLIMIT_NPROC, (spec["processes"], spec["processes"]))
    except OSError as exc:
        raise Refused(str(exc)) from exc


def child(spec, test, token, result_w, out_w):
    """In the forked child: run the program and the test; write ``token`` + the outcome to ``result_w``."""
    os.setpgid(0, 0)
    stdin_r, stdin_w = os.pipe()
    data = test.get("stdin", "").encode()
    if len(data) < 60000:  # a pipe's buffer holds it; a longer input goes through a file
        os.write(stdin_w, data)
        os.close(stdin_w)
    else:
        os.close(stdin_w)
        os.close(stdin_r)
        with open("input.txt", "wb") as f:
            f.write(data)
        stdin_r = os.open("input.txt", os.O_RDONLY)
    os.dup2(stdin_r, 0)
    os.dup2(out_w, 1)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    outcome = "passed"
    try:
        if spec.get("command"):
            outcome = "passed" if os.spawnvp(os.P_WAIT, spec["command"][0], spec["command"]) == 0 else "error:exit"
        else:
            scope = {"__name__": "__main__"}
            try:
                exec(compile(spec["program"], "program.py", "exec"), scope)
            except SystemExit as exc:
                if "assert" in test or exc.code not in (None, 0):
                    raise
            if "assert" in test:
                exec(compile(test["assert"], "test.py", "exec"), scope)
            sys.stdout.flush()
    except AssertionError:
        outcome = "failed"
    except BaseException as exc:
        outcome = "error:" + type(exc).__name__
    with contextlib.suppress(BaseException):
        sys.stdout.flush()
    os.write(result_w, (token + " " + outcome).encode())
    os._exit(0)


LIFELINE = None  # the caller's end of stdin, held open while it lives: EOF means it died, so this sandbox ends


def check_lifeline():
    if os.read(LIFELINE, 1) == b"":
        os._exit(3)  # the first process of the namespace: every process in it dies with it


def run_test(spec, test):
    token = secrets.token_hex(16)
    result_r, result_w = os.pipe()
    out_r, out_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(result_r)
        os.close(out_r)
        os.close(LIFELINE)
        child(spec, test, token, result_w, out_w)
    os.close(result_w)
    os.close(out_w)
    deadline = time.monotonic() + spec["test_seconds"]
    result, output, limit = b"", [], spec["output_bytes"]
    size, status, open_fds = 0, None, {result_r, out_r}
    while open_fds:
        left = deadline - time.monotonic()
        if left <= 0:
            status = "timed_out"
            break
        ready, _, _ = select.select([*open_fds, LIFELINE], [], [], left)
        if LIFELINE in ready:
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL)
            check_lifeline()
            ready.remove(LIFELINE)
        for fd in ready:
            chunk = os.read(fd, 65536)
            if not chunk:
                open_fds.discard(fd)
                os.close(fd)
            elif fd == result_r:
                result += chunk[:200]
            else:
                size += len(chunk)
                if size > limit:
                    status = "output_limit"
                    break
                output.append(chunk)
        if status:
            break
    for fd in open_fds:
        os.close(fd)
    for kill in (lambda: os.killpg(pid, signal.SIGKILL), lambda: os.kill(pid, signal.SIGKILL)):
        with contextlib.suppress(OSError):
            kill()
    _, code = os.waitpid(pid, 0)
    if status:
        return status
    text = result.decode(errors="replace")
    if not text.startswith(token + " "):
        if os.WIFSIGNALED(code):
            name = signal.Signals(os.WTERMSIG(code)).name if os.WTERMSIG(code) in signal.valid_signals() else "signal"
            return "error:" + ("CPU time limit" if name == "SIGXCPU" else name)
        return "error:exited without finishing"
    outcome = text[len(token) + 1 :]
    if outcome == "passed" and "stdout" in test:
        return "passed" if same_output(b"".join(output).decode(errors="replace"), test["stdout"]) else "failed"
    return outcome


def same_output(got, expected):
    """Equal up to trailing spaces on each line and trailing blank lines (APPS's comparison)."""

    def lines(text):
        return [line.rstrip() for line in text.strip("\n").splitlines()]

    return lines(got) == lines(str(expected))


def main():
    global LIFELINE
    spec = json.loads(sys.stdin.buffer.readline())
    LIFELINE = os.dup(0)
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    try:
        isolate(spec)
    except Refused as exc:
        sys.stdout.write(json.dumps({"refused": str(exc)}) + "\n")
        sys.stdout.flush()
        return
    if spec.get("command"):
        with open("program", "w") as f:
            f.write(spec["program"])
    results = [run_test(spec, test) for test in spec["tests"]]
    sys.stdout.write(json.dumps({"results": results}) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
