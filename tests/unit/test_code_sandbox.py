"""Hostile programs in the code reward's sandbox: each scores 0, the host is unchanged, nothing is left running.

Run on every sandbox backend that works here (bwrap, unshare); a backend that does not is skipped saying why.
"Nothing left running" is checked by scanning /proc for the program's label (on the sandbox's command line, which
forks keep) and for the marker a program puts on the commands it starts. The time limits below are the reward's
configured limits, which a looping program always reaches; the tests assert on outcomes, never on time.
"""

from __future__ import annotations

import hashlib
import os
import socket
import tempfile
import threading
import time
import uuid
from pathlib import Path

import pytest

import grpokit.rewards.code_reward as code_module
from grpokit.rewards import sandbox as sandbox_module
from grpokit.rewards.code_reward import (
    CodeReward,
    extract_program,
    longest_first,
    program_label,
    row_tests,
    score_results,
)

ADD_TESTS = ["assert add(1, 2) == 3", "assert add(2, 2) == 4"]


def _backend_or_skip(backend: str) -> CodeReward:
    why = sandbox_module._works(backend, os.geteuid() == 0)
    if why is not None:
        pytest.skip(f"the {backend} sandbox does not work on this machine: {why}")
    return CodeReward(sandbox=backend, test_seconds=2, total_seconds=20, memory_mb=512, processes=16)


@pytest.fixture(params=["bwrap", "unshare"])
def reward(request) -> CodeReward:
    return _backend_or_skip(request.param)


def _running_with(marker: str) -> list[str]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if marker in cmdline:
                found.append(f"{entry.name}: {cmdline}")
    return found


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _score(reward: CodeReward, program: str, tests=None, **columns):
    logged = {}
    if tests is not None:
        columns["test_list"] = [tests]
    values = reward(
        completions=[program], log_extra=lambda column, values: logged.__setitem__(column, values), **columns
    )
    return values[0], logged["code_tests"][0]


@pytest.fixture
def host(tmp_path):
    """A secret in the home folder, the reward's own module and a file in the test's folder, checked unchanged."""
    secret = Path.home() / f".grpokit-sandbox-secret-{uuid.uuid4().hex}"
    secret.write_text("the secret")
    module = Path(code_module.__file__)
    before = _digest(module)
    canary = tmp_path / "canary.txt"
    canary.write_text("untouched")
    yield {"secret": secret, "module": module, "canary": canary, "folder": tmp_path}
    try:
        assert secret.read_text() == "the secret"
        assert _digest(module) == before
        assert canary.read_text() == "untouched"
        assert sorted(p.name for p in tmp_path.iterdir()) == ["canary.txt"]
    finally:
        secret.unlink()


def _hostile(reward, host, body: str, tests=ADD_TESTS, **columns):
    """Score ``body`` (which may name MARKER, SECRET, MODULE, FOLDER); assert it scored 0 and left nothing running."""
    marker = f"grpokit-hostile-{uuid.uuid4().hex}"
    program = (
        body.replace("MARKER", marker)
        .replace("SECRET", str(host["secret"]))
        .replace("MODULE", str(host["module"]))
        .replace("FOLDER", str(host["folder"]))
    )
    value, results = _score(reward, program, tests, **columns)
    assert value == 0.0, results
    assert _running_with(marker) == [] and _running_with(program_label(program)) == []
    return results


def test_a_right_program_passes_and_a_wrong_one_fails(reward):
    assert _score(reward, "def add(a, b):\n    return a + b\n", ADD_TESTS) == (1.0, ["passed", "passed"])
    assert _score(reward, "```python\ndef add(a, b):\n    return a - b\n```", ADD_TESTS) == (0.0, ["failed", "failed"])
    value, results = _score(reward, "print(int(input()) * 2)", inputs=[["2", "5"]], outputs=[["4", "11"]])
    assert (value, results) == (0.0, ["passed", "failed"])


def test_reading_the_password_file_or_the_home_folder(reward, host):
    results = _hostile(reward, host, "assert 'root' in open('/etc/passwd').read()\ndef add(a, b): return a + b\n")
    assert results == ["error:FileNotFoundError"] * 2
    results = _hostile(reward, host, "assert open('SECRET').read()\ndef add(a, b): return a + b\n")
    assert results[0].startswith("error:")
    results = _hostile(
        reward, host, "import os\nassert os.listdir(os.path.expanduser('~root'))\ndef add(a, b): return a + b\n"
    )
    assert results[0].startswith("error:")


def test_writing_outside_the_work_folder(reward, host):
    body = (
        "import os\nopen('FOLDER/pwned', 'w').write('x')\nopen('SECRET', 'w').write('pwned')\n"
        "open('FOLDER/canary.txt', 'w').write('pwned')\ndef add(a, b): return a + b\n"
    )
    assert _hostile(reward, host, body)[0].startswith("error:")


def test_opening_a_socket(reward, host):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    listener.setblocking(False)
    port = listener.getsockname()[1]
    body = f"import socket\nsocket.create_connection(('127.0.0.1', {port}), 2)\ndef add(a, b): return a + b\n"
    try:
        results = _hostile(reward, host, body)
        assert results[0].startswith("error:")  # ConnectionRefusedError: its own empty loopback
        with pytest.raises(BlockingIOError):
            listener.accept()  # nothing reached the host's listener
    finally:
        listener.close()


def test_a_fork_bomb(reward, host):
    _hostile(reward, host, "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n")


def test_an_infinite_loop(reward, host):
    # stopped by a limit: the wall-clock deadline, or the CPU-time rlimit when a busy machine gives the loop its CPU
    # seconds before the deadline's wall seconds pass (which comes first depends on the load, not on the sandbox)
    results = _hostile(reward, host, "while True:\n    pass\n")
    assert len(results) == 2 and set(results) <= {"timed_out", "error:CPU time limit"}, results


def test_allocating_20_gb(reward, host):
    assert _hostile(reward, host, "x = bytearray(20 * 2**30)\ndef add(a, b): return a + b\n")[0] == "error:MemoryError"


def test_killing_its_parent(reward, host):
    # (its parent is the namespace's first process under some backends, which ignores a SIGKILL from inside)
    body = "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nos.kill(1, signal.SIGKILL)\n"
    assert all(r.startswith("error:") for r in _hostile(reward, host, body))


def test_a_daemon_that_outlives_the_test(reward, host):
    # (the daemons carry the marker in their own command line: python -c "..." MARKER)
    body = (
        "import os, subprocess, sys\nsleeper = [sys.executable, '-c', 'import time; time.sleep(600)', 'MARKER']\n"
        "if os.fork() == 0:\n    os.setsid()\n    os.execv(sys.executable, sleeper)\n"
        "subprocess.Popen(sleeper, start_new_session=True)\nos.system('setsid sleep 600 &')\n"
    )
    _hostile(reward, host, body)


def test_printing_1_gb(reward, host):
    body = "import sys\nfor _ in range(16384):\n    sys.stdout.write('x' * 65536)\nprint(4)\n"
    assert _hostile(reward, host, body, tests=None, inputs=[["2"]], outputs=[["4"]]) == ["output_limit"]


def test_editing_the_rewards_own_module(reward, host):
    body = "open('MODULE', 'a').write('\\nraise SystemExit')\ndef add(a, b): return a + b\n"
    assert _hostile(reward, host, body)[0].startswith("error:")


def test_exiting_early_does_not_pass(reward, host):
    assert _hostile(reward, host, "import os\nos._exit(0)\n") == ["error:exited without finishing"] * 2


def test_no_isolation_is_refused_in_one_line(monkeypatch):
    monkeypatch.setattr(sandbox_module, "_works", lambda backend, root: f"{backend} is not installed")
    with pytest.raises(sandbox_module.SandboxUnavailable, match="install bubblewrap") as info:
        CodeReward()
    assert "\n" not in str(info.value) and "sandbox: none" in str(info.value)


def test_sandbox_none_warns_loudly():
    with pytest.warns(UserWarning, match="WITHOUT isolation"):
        reward = CodeReward(sandbox="none")
    assert _score(reward, "def add(a, b):\n    return a + b\n", ADD_TESTS)[0] == 1.0


def test_extraction_tests_and_modes():
    text = "Here:\n```python\nx = 1\n```\nand better:\n```py\ndef f():\n    return 2\n```\n```text\nnot code\n```"
    assert extract_program(text) == "def f():\n    return 2\n"
    assert extract_program("def f(): pass") == "def f(): pass"
    assert row_tests({"test_list": ["assert f()"], "test_setup_code": "import math"}) == [
        {"assert": "import math\nassert f()"}
    ]
    assert row_tests({"input_output": '{"inputs": ["1\\n"], "outputs": ["2\\n"]}'}) == [
        {"stdin": "1\n", "stdout": "2\n"}
    ]
    assert row_tests({"answer": 3}) is None
    tests = [{"assert": "a"}, {"assert": "ccc"}, {"assert": "bb"}]
    assert longest_first(tests, 2) == [{"assert": "ccc"}, {"assert": "bb"}]
    assert longest_first(tests, 5) == tests

    # all: 1 only when every test passed; fraction: 1 of 3 passed = 0.333...
    assert score_results(["passed", "failed", "timed_out"], "all") == 0.0
    assert score_results(["passed", "passed"], "all") == 1.0
    assert score_results(["passed", "failed", "timed_out"], "fraction") == pytest.approx(1 / 3)


def test_a_row_without_tests_gets_none(reward):
    assert reward(completions=["x = 1"], answer=[3]) == [None]


def test_a_reward_worker_killed_at_its_timeout_takes_its_sandboxes_with_it(reward):
    from grpokit.rewards import RewardRunner

    marker = f"grpokit-hostile-{uuid.uuid4().hex}"
    spec = {"name": "code", "sandbox": reward.sandbox.backend, "test_seconds": 600, "total_seconds": 600}
    program = (
        f"import subprocess, sys\nsubprocess.run([sys.executable, '-c', 'import time; time.sleep(600)', '{marker}'])\n"
    )
    seen, done = threading.Event(), threading.Event()

    def watch():  # the sleeper did run: it is seen before the worker is killed
        while not done.is_set() and not seen.is_set():
            if _running_with(marker):
                seen.set()

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        with RewardRunner([spec], timeout=3, isolate=True) as runner:  # the worker is killed after 3 s
            values = runner.score_values(["p"], [program], {"test_list": [["assert True"]]})
    finally:
        done.set()
        watcher.join()
    assert "timed out" in values.messages[0][0] and seen.is_set()
    # The kernel delivers the parent-death signals one process after another: wait for them, not for a time
    # (the bound only stops a broken machine from hanging the suite).
    deadline = time.monotonic() + 60
    while _running_with(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _running_with(marker) == []
    # the killed worker's work folder is removed by the next sandbox run
    assert _score(reward, "def add(a, b):\n    return a + b\n", ADD_TESTS)[0] == 1.0
    assert [p for p in Path(tempfile.gettempdir()).glob(sandbox_module.BOX_PREFIX + "*") if _dead_owner(p)] == []


def _dead_owner(folder: Path) -> bool:
    pid = folder.name[len(sandbox_module.BOX_PREFIX) :].split("-", 1)[0]
    return pid.isdigit() and not Path(f"/proc/{pid}").exists()
