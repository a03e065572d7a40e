"""Running tool calls isolated, with a timeout, the turns of different rollouts concurrently.

Plain tools (functions) run in worker processes, on grpokit's killable reward-worker machinery
(:mod:`grpokit.system.workers`, with the reward contract's call): each worker is forked with the table of tools, so
lambdas and closures work, dies with the trainer and ignores Ctrl-C; a call past its timeout gets
its worker SIGKILLed (whatever it does, GIL held or not) and a new one is forked for the next call.
A tool that raises gives its exception as the result; a worker that dies (a segfault, ``os._exit``)
gives "crashed". Environment methods run on a thread of this process with the same timeout (why,
and what a timeout does to the environment: :mod:`grpokit.tools.environment`).

:meth:`ToolExecutor.submit` takes one turn of one rollout (the calls the model wrote in one
assistant message, its environment session) and returns a :class:`concurrent.futures.Future` of
its results, so a rollout loop can go on decoding the other sequences while it runs. The calls of a
turn run one after another (an environment's methods change its state in order); the turns of
different rollouts run at the same time, on ``max_workers`` worker processes / threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import os
import queue
import signal
import time
import traceback
import warnings
import weakref
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from grpokit.rewards.contract import Outcome, TimedCall, failed_outcome, run_call
from grpokit.system.workers import TIMED_OUT, WorkerProcess, process_context, run_calls
from grpokit.tools.environment import EnvironmentSession
from grpokit.tools.json_schema import ToolError, tool_schemas
from grpokit.tools.parsing import ToolCall, validate_calls
from grpokit.tools.tool_images import image_parts, images_refused, parts_text, shows_images

# status of a ToolResult: the tool returned | the call was malformed or did not fit the schema |
# the tool raised | it ran past its timeout | its worker process died | its environment is broken
STATUSES = ("ok", "invalid", "error", "timeout", "crashed", "unavailable")


@dataclass
class ToolResult:
    """What one call gave: ``content``, the text of the tool message the model reads next (the
    tool's return value as ``str``, TRL's rule, or ``{"error": ...}`` as JSON; a tool that returned images: its
    text parts, the images in ``parts``, :mod:`grpokit.tools.tool_images`), its ``status``
    (:data:`STATUSES`), ``error`` (None when ok) with the tool's ``traceback`` when it raised, and
    when it ran: ``started`` / ``ended`` (``time.monotonic()``, None when it did not run; measured
    around the call in the worker, so the calls of different workers compare), ``worker`` (the pid of
    the worker process, None for a thread of this process)."""

    call: ToolCall
    content: str
    status: str = "ok"
    error: str | None = None
    traceback: str | None = None
    started: float | None = None
    ended: float | None = None
    worker: int | None = None
    parts: list[dict[str, Any]] | None = None  # content parts with PIL images, when the tool returned images

    @property
    def images(self) -> list:
        """The PIL images the tool returned, in order ([]: a text result)."""
        return [p["image"] for p in self.parts or () if p["type"] == "image"]

    @property
    def duration(self) -> float | None:
        return None if self.started is None or self.ended is None else self.ended - self.started

    def message(self) -> dict[str, Any]:
        """The tool message for the conversation (``tool_call_id`` when the call had an id)."""
        content = self.content if self.parts is None else [dict(p) for p in self.parts]
        message = {"role": "tool", "name": self.call.name or "unknown", "content": content}
        if self.call.id is not None:
            message["tool_call_id"] = self.call.id
        return message


def _failed(call: ToolCall, status: str, error: str, **timing: Any) -> ToolResult:
    return ToolResult(call, json.dumps({"error": error}), status, error, **timing)


async def _await(awaitable: Any) -> Any:
    return await awaitable


def _invoke(fn: Callable, arguments: dict[str, Any]) -> dict[str, Any]:
    """Run one tool, in a worker process or a thread: its content or error, timed where it ran."""
    started = time.monotonic()
    content = error = trace = None
    try:
        value = fn(**arguments)
        if inspect.isawaitable(value):
            value = asyncio.run(_await(value))
        if shows_images(value):  # never its str(): the model would read a repr, the image dropped
            parts = image_parts(value)
            if isinstance(parts, str):
                return {"refused": parts, "started": started, "ended": time.monotonic()}
            content = {"parts": parts}
        else:
            content = value if isinstance(value, str) else str(value)
    except BaseException as exc:  # SystemExit from a tool is the tool's error too
        error, trace = f"{type(exc).__name__}: {exc}", traceback.format_exc()
    return {"content": content, "error": error, "traceback": trace, "started": started, "ended": time.monotonic()}


class _ToolTable:
    """What a worker process holds (inherited at fork): the tools by name."""

    def __init__(self, tools: dict[str, Callable]):
        self.tools = tools

    def __call__(self, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
        return {**_invoke(self.tools[tool], arguments), "worker": os.getpid()}


def _tool_process(table, context) -> WorkerProcess:
    """A killable worker process holding the table of tools: each call an Outcome of the reward contract's
    :func:`run_call`, whose output is :func:`_invoke`'s dict."""
    return WorkerProcess(table, context, run_call, failed_outcome, label="tool worker process", name="grpokit-tool")


def _kill(processes: list[WorkerProcess]) -> None:
    """Kill and reap every worker (no call may be running: a finalizer's job)."""
    for proc in processes:
        proc.kill()


def _signal_kill(processes: list[WorkerProcess]) -> None:
    """SIGKILL every worker without touching its WorkerProcess, which the thread running a call on it
    owns: that thread sees the pipe close and reaps it (a WorkerProcess is not thread-safe)."""
    for proc in processes:
        process = proc._process  # read once: its owner may replace it meanwhile
        if process is not None and process.pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signal.SIGKILL)


class ToolExecutor:
    """Runs tool calls: ``tools``, plain functions (the same for every rollout), in ``max_workers``
    worker processes (``isolation="process"``) or on threads (``"thread"``: a call past its timeout
    is abandoned, not killed); environment methods on threads. ``timeout``: seconds per call."""

    def __init__(
        self,
        tools: Sequence[Callable] = (),
        *,
        timeout: float = 30.0,
        max_workers: int = 4,
        isolation: str = "process",
    ):
        if isolation not in ("process", "thread"):
            raise ToolError(f"isolation must be 'process' or 'thread', got {isolation!r}")
        if not timeout > 0 or max_workers < 1:
            raise ToolError(f"need timeout > 0 and max_workers >= 1, got timeout={timeout}, max_workers={max_workers}")
        self.schemas = tool_schemas(list(tools))
        self.tools: dict[str, Callable] = {s["function"]["name"]: fn for s, fn in zip(self.schemas, tools)}
        self.timeout = float(timeout)
        self._closed = False
        self._processes: list[WorkerProcess] = []
        self._idle: queue.SimpleQueue[WorkerProcess] = queue.SimpleQueue()
        if self.tools and isolation == "process":
            table = _ToolTable(self.tools)
            context, why = process_context(table)
            if context is None:
                warnings.warn(
                    f"grpokit: tools run on threads of this process, where a timeout cannot stop code that holds "
                    f"the GIL, because {why}.",
                    stacklevel=2,
                )
            else:
                self._processes = [_tool_process(table, context) for _ in range(max_workers)]
                for proc in self._processes:
                    self._idle.put(proc)
        self._finalizer = weakref.finalize(self, _kill, self._processes)
        self._threads = ThreadPoolExecutor(max_workers, thread_name_prefix="grpokit-tools")

    def schemas_for(self, session: EnvironmentSession | None = None) -> list[dict[str, Any]]:
        """The schemas of the tools one rollout can call (``tools=`` of its prompt): the plain tools,
        then its environment's; a name both define is a :class:`ToolError`."""
        if session is None:
            return list(self.schemas)
        names = set(self.tools) & set(session.tools)
        if names:
            raise ToolError(
                f"the environment {type(session.instance).__name__} has tools named like plain tools: "
                f"{sorted(names)}; rename one, the model calls tools by name"
            )
        return [*self.schemas, *session.schemas]

    def submit(self, calls: Sequence[ToolCall], session: EnvironmentSession | None = None) -> Future:
        """Run one turn's ``calls`` (as parsed; checked here against the schemas) in order, on a free
        worker; a Future of their :class:`ToolResult` s. Never raises for a bad or failing call."""
        if self._closed:
            raise ToolError("this ToolExecutor is closed")
        checked = validate_calls(calls, self.schemas_for(session))
        return self._threads.submit(self._run_turn, checked, session)

    def run(self, turns: Sequence[tuple[Sequence[ToolCall], EnvironmentSession | None]]) -> list[list[ToolResult]]:
        """Each (calls, session) turn at once; their results in order. An exception while waiting
        (Ctrl-C) kills the busy workers and propagates."""
        futures = [self.submit(calls, session) for calls, session in turns]
        try:
            return [f.result() for f in futures]
        except BaseException:
            for f in futures:
                f.cancel()
            _signal_kill(self._processes)
            raise

    def _run_turn(self, calls: list[ToolCall], session: EnvironmentSession | None) -> list[ToolResult]:
        proc = None
        try:
            results = []
            for call in calls:
                if self._closed:
                    results.append(_failed(call, "unavailable", "the tool executor was closed"))
                elif call.error is not None:
                    results.append(_failed(call, "invalid", call.error))
                elif session is not None and call.name in session.tools:
                    results.append(self._run_in_environment(call, session))
                elif self._processes:
                    proc = proc or self._idle.get()
                    results.append(self._run_in_process(call, proc))
                else:
                    results.append(self._run_on_thread(call, self.tools[call.name]))
            return results
        finally:
            if proc is not None:
                self._idle.put(proc)

    def _from_outcome(self, call: ToolCall, outcome: Outcome, started: float) -> ToolResult:
        """A ToolResult from a reward-worker Outcome whose output is :func:`_invoke`'s dict."""
        if outcome.error is None:
            ran = outcome.output
            if ran.get("refused"):
                raise images_refused(call.name, ran["refused"])
            timing = {"started": ran["started"], "ended": ran["ended"], "worker": ran.get("worker")}
            if ran["error"] is None and isinstance(ran["content"], dict):  # content parts with images
                parts = ran["content"]["parts"]
                return ToolResult(call, parts_text(parts), parts=parts, **timing)
            if ran["error"] is None:
                return ToolResult(call, ran["content"], **timing)
            result = _failed(call, "error", f"{call.name} raised {ran['error']}", **timing)
            result.traceback = ran["traceback"]
            return result
        ended = time.monotonic()
        if outcome.error.startswith(TIMED_OUT):
            return _failed(
                call, "timeout", f"{call.name} timed out after {self.timeout:g} s", started=started, ended=ended
            )
        # the exit code is not reported: the pipe's EOF can come before the process is reaped
        return _failed(call, "crashed", f"{call.name} crashed: its process died", started=started, ended=ended)

    def _run_in_process(self, call: ToolCall, proc: WorkerProcess) -> ToolResult:
        started = time.monotonic()
        (outcome,) = run_calls([(proc, {"tool": call.name, "arguments": call.arguments}, 1)], self.timeout)
        if self._closed and outcome.error is not None:
            return _failed(call, "unavailable", "the tool executor was closed")
        return self._from_outcome(call, outcome, started)

    def _run_on_thread(self, call: ToolCall, fn: Callable) -> ToolResult:
        started = time.monotonic()
        outcome = TimedCall(_invoke, {"fn": fn, "arguments": call.arguments}, 1).result(self.timeout)
        return self._from_outcome(call, outcome, started)

    def _run_in_environment(self, call: ToolCall, session: EnvironmentSession) -> ToolResult:
        if session.broken is not None:
            return _failed(call, "unavailable", f"the environment is unusable: {session.broken}")
        result = self._run_on_thread(call, session.tools[call.name])
        if result.status == "timeout":
            session.broken = f"{call.name} timed out after {self.timeout:g} s and may still be running"
        return result

    def close(self) -> None:
        """Stop: kill the worker processes (they hold nothing to save) and let the threads go (an
        abandoned environment call runs on until it returns)."""
        self._closed = True
        self._threads.shutdown(wait=False, cancel_futures=True)
        _signal_kill(self._processes)

    def __enter__(self) -> ToolExecutor:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def tool_metrics(results: Sequence[Sequence[ToolResult]]) -> dict[str, float]:
    """TRL's tool metrics of a batch, from each rollout's results: ``tools/call_frequency``, calls per
    rollout, and ``tools/failure_frequency``, the share of calls that did not return a value (invalid,
    raised, timed out, crashed, unavailable; 0 without calls). TRL does not count calls its parser
    could not read; grpokit counts them, as failures."""
    calls = sum(len(r) for r in results)
    failures = sum(result.status != "ok" for r in results for result in r)
    return {
        "tools/call_frequency": calls / len(results) if results else 0.0,
        "tools/failure_frequency": failures / calls if calls else 0.0,
    }
