"""Functions in worker processes that can be killed, so no call can hang a run (reward functions,
grpokit/rewards/pool.py; tools, grpokit/tools/executor.py).

A thread cannot be stopped, and a function that holds the GIL (a catastrophic regex, C code)
stalls the whole process, its timeout thread and its signal handlers included. A
:class:`WorkerProcess` holds one function in a child process and runs one call at a time through the
``call`` its user gives (``call(fn, payload, n)`` returns the result, catching the function's errors);
the trainer waits on the pipes with a deadline (:func:`run_calls`) and kills a child that is past
it, or that is still running when the trainer is interrupted. A new child replaces it at the next call. A call
that cannot be answered (the child died, timed out, or its result cannot be sent back) gets ``failed(message)``.

On Linux the child is forked: it inherits the function, so lambdas, closures and functions of a
script without a ``__main__`` guard work, and it starts in milliseconds. It dies with the trainer
(``PR_SET_PDEATHSIG``), ignores SIGINT (a Ctrl-C reaches the whole process group; the trainer
decides) and takes SIGTERM's default action. Elsewhere it is spawned, which needs a picklable
function from an importable module (:func:`process_context` says why one is not).
"""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing
import os
import pickle
import signal
import sys
import time
from collections.abc import Callable, Mapping
from multiprocessing.connection import wait
from typing import Any

_PR_SET_PDEATHSIG = 1
TIMED_OUT = "timed out"  # how a call past its deadline's message begins


def process_context(fn: Callable) -> tuple[Any, str | None]:
    """(the multiprocessing context to run ``fn`` in, None) or (None, why it must stay in this process)."""
    if sys.platform == "linux":
        return multiprocessing.get_context("fork"), None
    if getattr(fn, "__module__", None) == "__main__":
        return None, "it is defined in the __main__ script, which a spawned process would run again"
    try:
        pickle.dumps(fn)
    except Exception as exc:
        return None, f"it cannot be pickled for a spawned process ({exc}); define it at module level"
    return multiprocessing.get_context("spawn"), None


def _serve(conn, fn: Callable, call: Callable, failed: Callable[[str], Any], parent: int) -> None:
    """The child's loop: receive (payload, n), run ``call(fn, payload, n)``, send its result; None or EOF ends it."""
    if sys.platform == "linux":
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # the trainer died before the line above
        return
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if "torch" in sys.modules:
        # A forked child cannot use the parent's OpenMP thread pool (torch ops would hang); one
        # thread each, as torch's own DataLoader workers do.
        sys.modules["torch"].set_num_threads(1)
    while True:
        try:
            task = conn.recv()
        except (EOFError, OSError):
            return
        if task is None:
            return
        payload, n = task
        result = call(fn, payload, n)
        try:
            conn.send(result)
        except (pickle.PicklingError, TypeError, AttributeError) as exc:
            conn.send(failed(f"its output or log cannot be sent back from the worker process: {exc}"))


class WorkerProcess:
    """One child process holding ``fn`` (started now, restarted when needed), running ``call(fn, payload, n)``;
    ``failed(message)`` is the result of a call it cannot answer, ``label`` names it in that message and ``name``
    is the process's. ``call`` and ``failed`` are module-level functions (a spawned child unpickles them)."""

    def __init__(
        self,
        fn: Callable,
        context: Any,
        call: Callable[[Callable, Mapping[str, Any], int], Any],
        failed: Callable[[str], Any],
        label: str = "worker process",
        name: str = "grpokit-worker",
    ):
        self.fn, self.call, self.failed, self.label, self.name = fn, call, failed, label, name
        self._context = context
        self._process = None
        self._conn = None
        self.start()

    def start(self) -> None:
        parent_end, child_end = self._context.Pipe()
        self._process = self._context.Process(
            target=_serve, args=(child_end, self.fn, self.call, self.failed, os.getpid()), name=self.name, daemon=True
        )
        self._process.start()
        child_end.close()
        self._conn = parent_end

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    def submit(self, payload: Mapping[str, Any], n: int) -> None:
        """Send one call; a child that died since its last call is replaced first."""
        if self._process is None or not self._process.is_alive():
            self.kill()
            self.start()
        self._conn.send((dict(payload), n))

    def kill(self) -> None:
        """End the child at once (SIGKILL) and reap it."""
        if self._process is not None:
            if self._process.is_alive():
                self._process.kill()
            self._process.join()
            self._conn.close()
        self._process = self._conn = None

    def close(self) -> None:
        """Ask an idle child to exit; kill it if it does not within a second."""
        if self._process is not None and self._process.is_alive():
            with contextlib.suppress(OSError):
                self._conn.send(None)
            self._process.join(1.0)
        self.kill()


def _died(proc: WorkerProcess) -> Any:
    """The outcome of a call whose process closed its pipe: it is ending, so it is reaped (a second at most) to
    say how it ended."""
    code = None
    if proc._process is not None:
        proc._process.join(_REAP_SECONDS)
        code = proc._process.exitcode
    proc.kill()
    return proc.failed(f"the {proc.label} {how_it_ended(code)}")


# How long a worker whose pipe closed may take to end before it is killed: it is exiting already.
_REAP_SECONDS = 1.0
_SIGNAL_CAUSES = {
    signal.SIGKILL: "the kernel's out-of-memory killer sends it, as does kill -9",
    signal.SIGSEGV: "a crash in C code: an extension the function uses",
    signal.SIGABRT: "an abort in C code: an extension the function uses",
    signal.SIGBUS: "a crash in C code: an extension the function uses",
    signal.SIGTERM: "another process asked it to stop",
}


def how_it_ended(exitcode: int | None) -> str:
    """``multiprocessing``'s ``exitcode`` of a worker as words: the exit status or the signal, and the
    likely cause (a worker only ends by itself through ``os._exit``, or the C code it runs)."""
    if exitcode is None:
        return "closed its pipe and did not exit (it was killed)"
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        cause = _SIGNAL_CAUSES.get(-exitcode)
        return f"was killed by {name}" + (f" ({cause})" if cause else "")
    return (
        f"exited with status {exitcode} while scoring (os._exit() in the reward function or the code it calls: "
        "a function a worker runs must return its values)"
    )


def run_calls(
    calls: list[tuple[WorkerProcess, Mapping[str, Any], int]], timeout: float, deadline: float | None = None
) -> list[Any]:
    """Run each (process, payload, n) at once and wait until all answered or ``timeout`` seconds
    passed (``deadline``: a ``time.monotonic()`` to use instead). A process past it is killed and
    its call times out; an exception while waiting (KeyboardInterrupt) kills every busy process."""
    deadline = time.monotonic() + timeout if deadline is None else deadline
    outcomes: list[Any] = [None] * len(calls)
    pending: dict[Any, int] = {}
    try:
        for i, (proc, payload, n) in enumerate(calls):
            try:
                proc.submit(payload, n)
                pending[proc._conn] = i
            except OSError:
                outcomes[i] = _died(proc)
        while pending:
            ready = wait(list(pending), timeout=max(0.0, deadline - time.monotonic()))
            if not ready:
                break
            for conn in ready:
                i = pending.pop(conn)
                try:
                    outcomes[i] = conn.recv()
                except (EOFError, OSError):
                    outcomes[i] = _died(calls[i][0])
    except BaseException:
        for i in pending.values():
            calls[i][0].kill()
        raise
    for i in pending.values():
        calls[i][0].kill()
        outcomes[i] = calls[i][0].failed(f"{TIMED_OUT} after {timeout:g} s (its worker process was killed)")
    return outcomes
