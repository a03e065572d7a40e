"""Where a RewardRunner's functions run: the :class:`RewardPool` protocol and the local pool.

The runner asks a pool for one thing: run every function on a batch, all at once, and give back
each function's :class:`~grpokit.rewards.contract.Outcome` per chunk of rows. Checking the outputs
and the weighted sum stay in the runner, whatever pool ran the functions. :class:`LocalRewardPool`
(the default) runs them on this machine: worker processes, or threads for reward models and
``isolate=False``. A pool elsewhere (Ray actors: ``grpokit.distributed.ray_rewards.RayRewardPool``) is
passed in by whoever builds the runner, so this package does not depend on where its functions run.
"""

from __future__ import annotations

import itertools
import time
import warnings
import weakref
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from grpokit.rewards.contract import LIVE_KEYWORDS, Outcome, TimedCall, failed_outcome, reads_live_objects, run_call
from grpokit.system.workers import WorkerProcess, process_context, run_calls

# [F][chunk] (rows, Outcome): what every function gave on each chunk of the batch it ran on
Outcomes = list[list[tuple[slice, Outcome]]]


class RewardPool(Protocol):
    """Runs a runner's reward functions (given to the pool when it is built, in the runner's order)."""

    def run(self, n: int, group_size: int, payload: Callable[[slice], dict[str, Any]], timeout: float) -> Outcomes:
        """Every function on the batch's ``n`` completions, all at once, ``timeout`` seconds per call.

        A pool may split the batch into chunks of whole groups of ``group_size`` adjacent completions
        (:func:`chunks`); ``payload(rows)`` gives the keywords of a call on those rows. A function that
        raises or times out gives an Outcome with an error, never an exception.
        """
        ...

    def close(self) -> None:
        """Stop the workers; a later ``run`` starts them again."""
        ...


# Builds a pool from the runner's (names, functions); e.g. functools.partial(RayRewardPool, workers=4).
PoolFactory = Callable[[list[str], list[Callable]], RewardPool]


def chunks(n: int, parts: int, group_size: int = 1) -> list[slice]:
    """At most ``parts`` contiguous, non-empty slices covering range(n), each a whole number of
    groups of ``group_size`` (which divides n), with near-equal numbers of groups."""
    groups = n // group_size
    parts = max(1, min(parts, groups))
    bounds = [round(k * groups / parts) * group_size for k in range(parts + 1)]
    return [slice(a, b) for a, b in itertools.pairwise(bounds)]


class LocalRewardPool:
    """The functions on this machine: each in ``max(1, workers)`` worker processes, each process scoring
    a chunk (``isolate`` or ``workers > 0``; ``isolate`` may be one flag per function); otherwise, and for reward
    models (``in_process``), functions that read live objects (``environments``) and functions a process cannot
    hold, on threads of this process, where a timeout cannot stop code that holds the GIL (with a warning naming
    why)."""

    def __init__(
        self, names: list[str], functions: list[Callable], workers: int = 0, isolate: bool | Sequence[bool] = True
    ):
        self.functions = functions
        # [F]: a function's worker processes (one per chunk), or None to run it on a thread here
        self.processes: list[list[WorkerProcess] | None] = [None] * len(functions)
        flags = [isolate] * len(functions) if isinstance(isolate, bool) else list(isolate)
        if len(flags) != len(functions):
            raise ValueError(f"got {len(flags)} isolation flags for {len(functions)} reward functions")
        self._start_processes(names, max(1, workers), [flag or workers > 0 for flag in flags])
        weakref.finalize(self, _kill_all, self.processes)

    def _start_processes(self, names: list[str], count: int, isolated: list[bool]) -> None:
        for f, (name, fn) in enumerate(zip(names, self.functions)):
            if not isolated[f] or getattr(fn, "in_process", False) or reads_live_objects(fn):
                continue
            context, why = process_context(fn)
            if context is None:
                warnings.warn(
                    f"grpokit: reward {name!r} runs in the trainer's process, where its timeout cannot stop "
                    f"code that holds the GIL, because {why}.",
                    stacklevel=4,  # the caller of RewardRunner(...)
                )
                continue
            self.processes[f] = [reward_process(fn, context) for _ in range(count)]

    def run(self, n: int, group_size: int, payload: Callable[[slice], dict[str, Any]], timeout: float) -> Outcomes:
        deadline = time.monotonic() + timeout
        whole = slice(0, n)
        threads = {
            f: TimedCall(fn, payload(whole), n) for f, fn in enumerate(self.functions) if self.processes[f] is None
        }
        calls, where = [], []  # where: (function, rows) of each process call
        for f, processes in enumerate(self.processes):
            if processes is not None:
                for proc, rows in zip(processes, chunks(n, len(processes), group_size)):
                    sent = {k: v for k, v in payload(rows).items() if k not in LIVE_KEYWORDS}  # live objects stay here
                    calls.append((proc, sent, rows.stop - rows.start))
                    where.append((f, rows))
        outcomes: Outcomes = [[] for _ in self.functions]
        for (f, rows), outcome in zip(where, run_calls(calls, timeout, deadline)):
            outcomes[f].append((rows, outcome))
        for f, call in threads.items():
            outcomes[f].append((whole, call.result(timeout)))
        return outcomes

    def close(self) -> None:
        for processes in self.processes:
            for proc in processes or ():
                proc.close()


def _kill_all(processes: list[list[WorkerProcess] | None]) -> None:
    for group in processes:
        for proc in group or ():
            proc.kill()


def reward_process(fn: Callable, context) -> WorkerProcess:
    """A killable worker process holding reward function ``fn``: each call an Outcome (:func:`run_call`)."""
    return WorkerProcess(fn, context, run_call, failed_outcome, label="reward worker process", name="grpokit-reward")
