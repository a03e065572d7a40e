"""Programs that try to undo the code reward's sandbox from inside (issue 60), on each backend, as root and as an
ordinary user (uid 65534: a subprocess that drops to it when the tests run as root; the process itself otherwise).

Each hostile program comes with a task whose only way to pass is its escape (a test that expects the planted
secret's text, a capability, a mount that succeeded...), so an escape that works scores 1 and fails the test. What
is planted is owned by the user the programs run as (nobody when grpokit is root, else the invoking user), so only
the sandbox keeps it out: a secret of mode 0600 in that user's folder, a file in the host's /dev/shm, and (as root) a
setuid-root copy of ``id``. ``test_the_tasks_are_winnable_without_a_sandbox`` scores the escapes that need no
privilege with ``sandbox: none``: they score 1 there, so a 0 in a sandbox is the sandbox's doing.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import pytest

from grpokit.rewards import sandbox as sandbox_module
from grpokit.rewards.code_reward import CodeReward

NOBODY = 65534
REPO = Path(__file__).resolve().parents[2]
ROOT = os.geteuid() == 0
CLONE_NEWNS, CLONE_NEWUSER = 0x20000, 0x10000000

PRELUDE = """import ctypes, os, subprocess
libc = ctypes.CDLL(None, use_errno=True)

def unmount_all():
    for _ in range(4):
        try:
            points = [line.split()[4] for line in open('/proc/self/mountinfo')]
        except OSError:
            return
        for point in reversed(points):
            if point != '/proc':
                libc.umount2(point.encode(), 2)  # MNT_DETACH

def status():
    return {k: v.strip() for k, v in (line.split(':', 1) for line in open('/proc/self/status'))}

"""

# name: (the hostile program's escape(), the test that passes only when it worked)
ESCAPES = {
    "unmount the tmpfs layers": ("unmount_all()\n    return open('SECRET').read()", "escape() == 'TEXT'"),
    "remount / and /usr read-write": (
        "return [p for p in ('/', '/usr') if libc.mount(b'none', p.encode(), None, 32 | 4096, None) == 0]",
        "escape()",  # MS_REMOUNT | MS_BIND without MS_RDONLY: made writable
    ),
    "mount a new tmpfs or proc": (
        "return [t for t in ('tmpfs', 'proc') if libc.mount(t.encode(), b'/tmp', t.encode(), 0, None) == 0]",
        "escape()",
    ),
    "pivot_root": (
        "return libc.syscall({'aarch64': 41}.get(os.uname().machine, 155), b'/tmp', b'/tmp')",
        "escape() == 0",
    ),
    "read the host's /dev/shm": ("return open('SHM').read()", "escape() == 'SHMTEXT'"),
    "hold a capability": (
        "return [k for k in ('CapInh', 'CapPrm', 'CapEff', 'CapBnd', 'CapAmb') if int(status()[k], 16)]",
        "escape()",
    ),
    "no_new_privs unset": ("return status()['NoNewPrivs']", "escape() == '0'"),
    "ptrace the parent": ("return libc.ptrace(0x4206, os.getppid(), 0, 0)", "escape() == 0"),  # PTRACE_SEIZE
    "/proc/1/root": (
        "return [open(f'/proc/{p}/root' + 'SECRET').read() for p in os.listdir('/proc') if p.isdigit()]",
        "'TEXT' in escape()",
    ),
    "a user namespace of its own": (
        f"libc.unshare({CLONE_NEWUSER | CLONE_NEWNS})\n    unmount_all()\n    return open('SECRET').read()",
        "escape() == 'TEXT'",
    ),
    "read the 0600 secret": ("return open('SECRET').read()", "escape() == 'TEXT'"),
    "write beside the secret": (
        "unmount_all()\n    for p in ('/', '/home', 'FOLDER'):\n"
        "        libc.mount(b'none', p.encode(), None, 32 | 4096, None)\n"
        "    open('BESIDE', 'w').write('pwned')\n    return open('SECRET').read()",
        "escape() == 'TEXT'",
    ),
    "run a setuid-root binary": (
        "return subprocess.run(['SETUID', '-u'], capture_output=True, text=True).stdout.strip()",
        "escape() == '0'",
    ),
}
# the escapes that need no privilege: with sandbox: none they must score 1
WINNABLE = ("read the host's /dev/shm", "no_new_privs unset", "ptrace the parent", "read the 0600 secret")


def _program(name: str, planted: dict) -> tuple[str, str]:
    body, test = ESCAPES[name]
    program = PRELUDE + "def escape():\n    " + body + "\n"
    for key in ("SHMTEXT", "SHM", "SECRET", "TEXT", "BESIDE", "FOLDER", "SETUID"):  # SHMTEXT before SHM and TEXT
        program, test = program.replace(key, str(planted[key])), test.replace(key, str(planted[key]))
    return program, f"assert {test}"


def _plant(owner: int, tag: str) -> dict:
    """A 0600 secret in a 0700 folder owned by ``owner``, a file in the host's /dev/shm, a setuid-root ``id``."""
    base = Path("/home") if ROOT else Path.home()
    folder = base / f".grpokit-escape-{tag}"
    folder.mkdir(mode=0o700)
    secret = folder / "secret"
    secret.write_text(f"secret {tag}")
    secret.chmod(0o600)
    shm = Path(f"/dev/shm/grpokit-escape-{tag}")
    shm.write_text(f"shm {tag}")
    shm.chmod(0o600)
    for path in (folder, secret, shm):
        os.chown(path, owner, owner)
    planted = {"SECRET": secret, "TEXT": f"secret {tag}", "FOLDER": folder, "BESIDE": folder / "pwned"}
    planted.update({"SHM": shm, "SHMTEXT": f"shm {tag}", "SETUID": "/nonexistent"})
    if ROOT:  # shown to the programs read-only: /var/tmp, as the unshare view puts a fresh tmpfs on /tmp
        bin_folder = Path(tempfile.mkdtemp(prefix="grpokit-setuid-", dir="/var/tmp"))
        bin_folder.chmod(0o755)
        shutil.copy(shutil.which("id"), bin_folder / "id")
        (bin_folder / "id").chmod(0o4755)
        planted["SETUID"] = bin_folder / "id"
    return planted


def _unplant(planted: dict) -> None:
    shutil.rmtree(planted["FOLDER"], ignore_errors=True)
    Path(planted["SHM"]).unlink(missing_ok=True)
    if str(planted["SETUID"]) != "/nonexistent":
        shutil.rmtree(Path(planted["SETUID"]).parent, ignore_errors=True)


RUNNER = """import json, sys
from grpokit.rewards.code_reward import CodeReward
from grpokit.rewards.sandbox import SandboxUnavailable
job = json.loads(sys.stdin.read())
try:
    reward = CodeReward(sandbox=job['backend'], readonly=job['readonly'], test_seconds=5, total_seconds=30,
                        memory_mb=512, processes=16)
except SandboxUnavailable as exc:
    print(json.dumps({'unavailable': str(exc)}))
    raise SystemExit
logged = {}
values = reward(completions=job['programs'], test_list=job['tests'], log_extra=lambda c, v: logged.__setitem__(c, v))
print(json.dumps({'values': values, 'results': logged['code_tests']}))
"""


def _libc_call(result: int, what: str) -> None:
    if result != 0:
        raise OSError(ctypes.get_errno(), what)


def _become(uid: int | None, user_namespaces: int | None = None):
    """A preexec_fn: (as root) show the interpreter's prefix when its top folder is closed to others (/root is
    0700), in a private mount namespace, then become ``uid``; with ``user_namespaces``, enter a user namespace of its
    own that may hold only that many more (so the sandbox cannot nest as deep as it needs)."""
    prefix = os.path.realpath(sys.base_prefix)
    top = "/" + prefix.split("/")[1]

    def preexec():
        libc = ctypes.CDLL(None, use_errno=True)
        if uid is not None and not os.stat(top).st_mode & 0o001:
            _libc_call(libc.unshare(CLONE_NEWNS), "unshare")
            _libc_call(libc.mount(b"none", b"/", None, 16384 | (1 << 18), None), "make / private")
            fd = os.open(prefix, os.O_PATH)
            _libc_call(libc.mount(b"tmpfs", top.encode(), b"tmpfs", 0, b"mode=755"), "tmpfs on " + top)
            os.makedirs(prefix)
            _libc_call(libc.mount(f"/proc/self/fd/{fd}".encode(), prefix.encode(), None, 4096 | 16384, None), "bind")
        if uid is not None:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            libc.prctl(4, 1, 0, 0, 0)  # PR_SET_DUMPABLE, which the change of user cleared: /proc/self is its own
        if user_namespaces is not None:
            me, group = os.getuid(), os.getgid()
            _libc_call(libc.unshare(CLONE_NEWUSER), "a user namespace")
            for name, text in (("setgroups", "deny"), ("uid_map", f"{me} {me} 1"), ("gid_map", f"{group} {group} 1")):
                Path(f"/proc/self/{name}").write_text(text)
            Path("/proc/sys/user/max_user_namespaces").write_text(str(user_namespaces))

    return preexec


def _score_as(user: str, job: dict, user_namespaces: int | None = None) -> dict:
    """Score ``job`` as ``user``: root or ordinary (uid 65534 in a subprocess when this process is root)."""
    if user == "root" or (not ROOT and user_namespaces is None):
        return _score_here(job)
    home = Path(job["home"])
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home), "PYTHONPATH": str(REPO)}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    done = subprocess.run(
        [sys.executable, "-c", RUNNER],
        input=json.dumps(job),
        capture_output=True,
        text=True,
        cwd=home,
        env=env,
        preexec_fn=_become(NOBODY if ROOT else None, user_namespaces),
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _score_here(job: dict) -> dict:
    try:
        reward = CodeReward(
            sandbox=job["backend"], readonly=job["readonly"], test_seconds=5, total_seconds=30, processes=16
        )
    except sandbox_module.SandboxUnavailable as exc:
        return {"unavailable": str(exc)}
    logged = {}
    log = lambda column, values: logged.__setitem__(column, values)
    values = reward(completions=job["programs"], test_list=job["tests"], log_extra=log)
    return {"values": values, "results": logged["code_tests"]}


def _run_escapes(backend: str, user: str, names) -> tuple[dict, dict]:
    """Plant, score every escape in ``names`` in one reward call, check the host is unchanged, clean up."""
    if user == "root" and not ROOT:
        pytest.skip("the root path needs the tests to run as root")
    planted = _plant(NOBODY if ROOT else os.getuid(), uuid.uuid4().hex[:12])
    try:
        pairs = [_program(name, planted) for name in names]
        job = {
            "backend": backend,
            "readonly": [str(Path(planted["SETUID"]).parent)] if ROOT else [],
            "programs": [program for program, _ in pairs],
            "tests": [[test] for _, test in pairs],
            "home": str(planted["FOLDER"]),
        }
        outcome = _score_as(user, job)
        host = {
            "secret": Path(planted["SECRET"]).read_text(),
            "beside": Path(planted["BESIDE"]).exists(),
            "shm": Path(planted["SHM"]).read_text(),
        }
        assert host["secret"] == planted["TEXT"] and host["shm"] == planted["SHMTEXT"]
        return outcome, host
    finally:
        _unplant(planted)


@pytest.mark.parametrize("user", ["root", "ordinary"])
@pytest.mark.parametrize("backend", ["bwrap", "unshare"])
def test_no_escape_scores(backend, user):
    names = [name for name in ESCAPES if ROOT or name != "run a setuid-root binary"]
    outcome, host = _run_escapes(backend, user, names)
    if "unavailable" in outcome:
        pytest.skip(f"the {backend} sandbox does not run here as this user: {outcome['unavailable']}")
    escaped = {name: result for name, value, result in zip(names, outcome["values"], outcome["results"]) if value}
    assert escaped == {}, escaped
    assert not host["beside"], "a file was written beside the secret"
    # each escape ran and failed (an error or a failed assert), none was cut short by a limit
    assert all(r[0] == "failed" or r[0].startswith("error:") for r in outcome["results"]), outcome["results"]


def test_the_tasks_are_winnable_without_a_sandbox():
    with pytest.warns(UserWarning, match="WITHOUT isolation"):
        outcome, _ = _run_escapes("none", "root" if ROOT else "ordinary", WINNABLE)
    assert outcome["values"] == [1.0] * len(WINNABLE), dict(zip(WINNABLE, outcome["results"]))


@pytest.mark.parametrize("backend", ["unshare", "bwrap"])
def test_a_view_that_cannot_be_locked_is_refused_in_one_line(backend, tmp_path):
    """As an ordinary user in a user namespace that may hold just one more: the sandbox's own fits, the lock's
    (unshare) or bwrap's nested one does not, so the backend must be refused, not used unlocked."""
    if sandbox_module._works(backend, ROOT) is not None:
        pytest.skip(f"the {backend} sandbox does not work here: {sandbox_module._works(backend, ROOT)}")
    home = Path(tempfile.mkdtemp(prefix="grpokit-escape-home-"))
    try:
        os.chown(home, *(2 * [NOBODY if ROOT else os.getuid()]))
        job = {"backend": backend, "readonly": [], "programs": ["x = 1"], "tests": [["assert x == 1"]]}
        outcome = _score_as("ordinary", {**job, "home": str(home)}, user_namespaces=1)
    finally:
        shutil.rmtree(home, ignore_errors=True)
    assert "unavailable" in outcome, outcome
    message = outcome["unavailable"]
    assert "\n" not in message and "install bubblewrap" in message and "max_user_namespaces" in message, message
    if backend == "unshare":  # bwrap (--disable-userns) nests one user namespace more itself and fails first
        assert "unshare: cannot isolate programs: [Errno 28] a second user namespace" in message, message
