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

SHOWN = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/proc", "/dev")


def private_view(keep):
    """The ``unshare`` backend (bwrap does this itself): in this process's new mount namespace, hide every top-level
    folder but the system's under an empty tmpfs, show ``keep`` (the interpreter's prefix) again, make every mount
    read-only, and work in a fresh tmpfs on /tmp."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    rdonly, nosuid, nodev, remount, bind, rec, private = 1, 2, 4, 32, 4096, 16384, 1 << 18

    def mount(source, target, fstype, flags, data=None):
        encoded = [None if x is None else x.encode() for x in (source, target, fstype, data)]
        if libc.mount(encoded[0], encoded[1], encoded[2], flags, encoded[3]) != 0:
            raise OSError(ctypes.get_errno(), "mount " + target)

    mount("none", "/", None, rec | private)
    fds = [(path, os.open(path, os.O_PATH)) for path in keep]
    for name in os.listdir("/"):
        path = "/" + name
        if path not in SHOWN and os.path.isdir(path) and not os.path.islink(path):
            mount("tmpfs", path, "tmpfs", nosuid | nodev, "size=1m,mode=755")
    for path, fd in fds:
        os.makedirs(path, exist_ok=True)
        mount(f"/proc/self/fd/{fd}", path, None, bind | rec)
        os.close(fd)
    with open("/proc/self/mountinfo") as f:
        points = [(line.split()[4], line.split()[5].split(",")) for line in f]
    kept = {"nosuid": nosuid, "nodev": nodev, "noexec": 8}
    for point, options in points:
        flags = sum(flag for option, flag in kept.items() if option in options)
        # a mount that cannot change (locked, gone) stays as the host has it, hidden or read-only above
        with contextlib.suppress(OSError):
            mount("none", point, None, remount | bind | rdonly | flags)
    mount("tmpfs", "/tmp", "tmpfs", nosuid | nodev, "size=64m,mode=1777")
    os.chdir("/tmp")


def drop_privileges(uid, processes):
    if uid is not None and os.getuid() == 0:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
        # a change of user clears the parent-death signal that bwrap (--die-with-parent) and unshare (--kill-child)
        # set: set it again, so this namespace dies with them
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if processes is not None:
        resource.setrlimit(resource.RLIMIT_NPROC, (processes, processes))


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
    if spec.get("keep") is not None:
        private_view(spec["keep"])
    drop_privileges(spec.get("uid"), spec.get("processes"))
    if spec.get("command"):
        with open("program", "w") as f:
            f.write(spec["program"])
    results = [run_test(spec, test) for test in spec["tests"]]
    sys.stdout.write(json.dumps({"results": results}) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
