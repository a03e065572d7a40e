"""Tool calls run isolated: results, a raising tool, a hanging tool (killed, the next call runs), a tool
holding the GIL, a crashing worker, malformed calls, and turns of different rollouts at the same time."""

from __future__ import annotations

import json
import os
import re
import time

import pytest

from grpokit.tools.executor import ToolExecutor
from grpokit.tools.parsing import ToolCall


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first.
        b: The second.
    """
    return a + b


def divide(a: int, b: int) -> float:
    """Divide.

    Args:
        a: The dividend.
        b: The divisor.
    """
    return a / b


def sleep(seconds: float) -> str:
    """Sleep.

    Args:
        seconds: How long.
    """
    time.sleep(seconds)
    return "awake"


def backtrack(n: int) -> bool:
    """A catastrophic regex: holds the GIL for far longer than any timeout here.

    Args:
        n: The length of the subject.
    """
    return re.match(r"(a+)+$", "a" * n + "!") is not None


def die(code: int) -> None:
    """End the process at once.

    Args:
        code: The exit code.
    """
    os._exit(code)


async def fetch(key: str) -> str:
    """An async tool.

    Args:
        key: What to fetch.
    """
    return f"value of {key}"


TOOLS = [add, divide, sleep, backtrack, die, fetch]


def call(name, **arguments):
    return ToolCall(name, arguments, f"<call {name}>", 0, 0)


@pytest.fixture(scope="module")
def executor():
    # no call of this module's tests is meant to time out: 30 s is a hang guard, far past a loaded machine's delays
    with ToolExecutor(TOOLS, timeout=30.0, max_workers=2) as ex:
        yield ex


def test_a_call_runs_in_a_worker_process(executor):
    ((result,),) = executor.run([([call("add", a=2, b=3)], None)])
    assert (result.status, result.content, result.error) == ("ok", "5", None)
    assert result.worker is not None and result.worker != os.getpid()
    assert result.started <= result.ended and result.duration >= 0
    assert result.message() == {"role": "tool", "name": "add", "content": "5"}
    ((result,),) = executor.run([([call("fetch", key="k")], None)])
    assert result.content == "value of k"


def test_a_raising_tool_gives_its_error_as_the_result(executor):
    (results,) = executor.run([([call("divide", a=1, b=0), call("add", a=1, b=1)], None)])
    failed, after = results
    assert failed.status == "error"
    assert failed.error == "divide raised ZeroDivisionError: division by zero"
    assert json.loads(failed.content) == {"error": "divide raised ZeroDivisionError: division by zero"}
    assert "return a / b" in failed.traceback
    assert (after.status, after.content) == ("ok", "2")  # the turn goes on


@pytest.mark.parametrize(("name", "arguments"), [("sleep", {"seconds": 60}), ("backtrack", {"n": 64})])
def test_a_hanging_tool_is_killed_and_the_next_call_runs(name, arguments):
    with ToolExecutor(TOOLS, timeout=0.5, max_workers=1) as executor:
        (worker,) = executor._processes
        pid = worker.pid
        ((hung,),) = executor.run([([call(name, **arguments)], None)])
        assert (hung.status, hung.error) == ("timeout", f"{name} timed out after 0.5 s")
        assert json.loads(hung.content) == {"error": hung.error}
        assert worker.pid is None  # killed and reaped
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
        executor.timeout = 60.0  # the next call starts a new worker, which a loaded machine may take > 0.5 s to do
        ((after,),) = executor.run([([call("add", a=1, b=2)], None)])
        assert (after.status, after.content) == ("ok", "3")
        assert after.worker not in (None, pid)  # a new worker


def test_a_crashing_worker_is_reported_and_replaced():
    with ToolExecutor(TOOLS, timeout=5.0, max_workers=1) as executor:
        ((crashed,),) = executor.run([([call("die", code=3)], None)])
        assert (crashed.status, crashed.error) == ("crashed", "die crashed: its process died")
        ((after,),) = executor.run([([call("add", a=1, b=2)], None)])
        assert after.content == "3"


def test_malformed_and_mismatched_calls_are_not_run(executor):
    (results,) = executor.run(
        [
            (
                [
                    ToolCall(None, {}, "<tool_call>{", 0, 12, error="the tool call is not valid JSON"),
                    call("multiply", a=1, b=2),
                    call("add", a=1),
                    call("add", a="1", b=2),
                    call("add", a=1, b=2),
                ],
                None,
            )
        ]
    )
    assert [r.status for r in results] == ["invalid", "invalid", "invalid", "invalid", "ok"]
    assert [r.error for r in results[:4]] == [
        "the tool call is not valid JSON",
        "there is no tool named 'multiply' (the tools are: 'add', 'divide', 'sleep', 'backtrack', 'die', 'fetch')",
        "wrong arguments for 'add': missing required argument 'b'",
        "wrong arguments for 'add': argument 'a' must be integer, got str '1'",
    ]
    assert all(r.started is None for r in results[:4])
    assert results[0].message()["name"] == "unknown"


def _overlap(results):
    """All calls started before any ended: they ran at the same time."""
    return max(r.started for r in results) < min(r.ended for r in results)


def test_turns_of_different_rollouts_run_at_the_same_time():
    n = 4
    with ToolExecutor(TOOLS, timeout=30.0, max_workers=n) as executor:
        results = [turn[0] for turn in executor.run([([call("sleep", seconds=1.0)], None)] * n)]
    assert [r.content for r in results] == ["awake"] * n
    assert len({r.worker for r in results}) == n
    assert _overlap(results)


def test_calls_of_one_turn_run_in_order(executor):
    (results,) = executor.run([([call("sleep", seconds=0.2), call("sleep", seconds=0.2)], None)])
    first, second = results
    assert first.ended <= second.started


def test_closures_and_thread_isolation():
    factor = 7

    def scale(x: int) -> int:
        """Scale by a captured factor.

        Args:
            x: The value.
        """
        return factor * x

    for isolation in ("process", "thread"):
        # scale must answer within the timeout on a loaded machine too (3 s); sleep outlasts it (10 s)
        with ToolExecutor([scale, sleep], timeout=3.0, max_workers=2, isolation=isolation) as executor:
            ((ok,), (hung,)) = executor.run([([call("scale", x=6)], None), ([call("sleep", seconds=10)], None)])
            assert ok.content == "42"
            assert hung.status == "timeout"
            assert (ok.worker is None) == (isolation == "thread")


def test_bad_settings_and_use_after_close():
    from grpokit.tools.json_schema import ToolError

    with pytest.raises(ToolError, match="isolation must be"):
        ToolExecutor([add], isolation="docker")
    with pytest.raises(ToolError, match="timeout > 0"):
        ToolExecutor([add], timeout=0)
    executor = ToolExecutor([add], max_workers=1)
    executor.close()
    with pytest.raises(ToolError, match="closed"):
        executor.submit([call("add", a=1, b=2)])


def _dead(pid: int, within: float = 5.0) -> bool:
    """Whether process ``pid`` is gone (or a zombie) within ``within`` seconds."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().split(")")[-1].split()[0] == "Z":
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.02)
    return False


def sleep_after_mark(path: str, seconds: float) -> str:
    """Create a file, then sleep.

    Args:
        path: The file to create once running.
        seconds: How long to sleep.
    """
    open(path, "w").close()
    time.sleep(seconds)
    return "awake"


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="reads process states from /proc (Linux)")
def test_close_kills_a_running_call(tmp_path):
    mark = tmp_path / "running"
    executor = ToolExecutor([sleep_after_mark], timeout=60.0, max_workers=1)
    (worker,) = executor._processes
    pid = worker.pid
    turn = [call("sleep_after_mark", path=str(mark), seconds=60), call("sleep_after_mark", path="x", seconds=1)]
    future = executor.submit(turn)
    while not mark.exists():
        time.sleep(0.01)
    executor.close()
    closed = ("unavailable", "the tool executor was closed")
    assert [(r.status, r.error) for r in future.result(timeout=10)] == [closed, closed]  # the second never ran
    assert _dead(pid)


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="reads process states from /proc (Linux)")
def test_ctrl_c_while_waiting_kills_the_busy_workers(tmp_path):
    import signal
    import threading

    mark = tmp_path / "running"

    def ctrl_c_once_the_call_runs():
        while not mark.exists():
            time.sleep(0.01)
        os.kill(os.getpid(), signal.SIGINT)  # a real Ctrl-C, as the terminal sends it

    # Python's own Ctrl-C handler, whatever an earlier test in this process left installed (the whole suite
    # runs Ray drivers and trainers in this process before this test)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with ToolExecutor([add, sleep_after_mark], timeout=60.0, max_workers=1) as executor:
            (worker,) = executor._processes
            pid = worker.pid
            threading.Thread(target=ctrl_c_once_the_call_runs, daemon=True).start()
            with pytest.raises(KeyboardInterrupt):
                executor.run([([call("sleep_after_mark", path=str(mark), seconds=60)], None)])
            assert _dead(pid)
            # the executor goes on: a new worker replaces the killed one
            ((after,),) = executor.run([([call("add", a=2, b=2)], None)])
            assert after.content == "4" and after.worker != pid
    finally:
        signal.signal(signal.SIGINT, previous)


def test_tool_metrics():
    from grpokit.tools.executor import ToolResult, tool_metrics

    def result(status):
        return ToolResult(call("add", a=1, b=1), "", status)

    # 3 rollouts, 3 calls (one per rollout), 2 failed: 3 / 3 = 1 call per rollout, 2 / 3 failed
    metrics = tool_metrics([[result("ok"), result("error")], [], [result("timeout")]])
    assert metrics == {"tools/call_frequency": 1.0, "tools/failure_frequency": 2 / 3}
    assert tool_metrics([[], []]) == {"tools/call_frequency": 0.0, "tools/failure_frequency": 0.0}
