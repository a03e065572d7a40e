"""The producers' side of rollouts sampled ahead: one background thread that finishes, in order, the sampling the
learner's thread admitted (waits for Ray workers' results, or samples on a copy of the policy), and ``scorers``
threads that score the finished batches, up to that many at once (a slow reward, a remote verifier or a judge then
overlaps the next batches' sampling and the learner's updates).

The learner's thread admits a job (:meth:`Producer.admit`: its sampling and its scoring, two calls without
arguments) and later takes its result (:meth:`Producer.take`). What a job computes is fixed when it is admitted
(its prompts, seeds and weights), so its result does not depend on when a thread gets to it. The producer counts how
long the sampling thread sat idle waiting for admission (the staleness bound holding it back) and how long the
learner waited for a result; a job's exception is raised where its result is taken.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any


class Producer:
    """The sampling thread, the scoring threads (``scorers``) and the jobs by key (a step number)."""

    def __init__(self, scorers: int = 1) -> None:
        self._jobs: list[tuple[Future, Callable[[], Any], Callable[[Any], Any]]] = []
        self._futures: dict[int, Future] = {}  # key -> the job's final result
        self._closed = False
        self._cond = threading.Condition()
        self._idle_since: float | None = time.perf_counter()
        self._producer_wait = 0.0  # seconds the sampling thread waited for a job, since the last counters()
        self._learner_wait = 0.0  # seconds the learner waited in take(), since then
        self._scoring = ThreadPoolExecutor(max_workers=scorers, thread_name_prefix="grpokit-scorer")
        self._thread = threading.Thread(target=self._run, name="grpokit-producer", daemon=True)
        self._thread.start()

    def admit(self, key: int, sample: Callable[[], Any], score: Callable[[Any], Any]) -> None:
        """Queue job ``key``: ``sample()`` runs after every job admitted before it; ``score(sampled)`` then runs on a
        scoring thread; the job's result is (sampled, scored)."""
        future: Future = Future()
        with self._cond:
            self._futures[key] = future
            self._jobs.append((future, sample, score))
            self._cond.notify_all()

    def take(self, key: int) -> Any:
        """Job ``key``'s result, waiting for it (the wait counts as the learner's); its exception raised here."""
        if key not in self._futures:
            raise RuntimeError(f"no job {key} was admitted to the producer")
        started = time.perf_counter()
        try:
            return self._futures.pop(key).result()
        finally:
            self._learner_wait += time.perf_counter() - started

    def peek(self, key: int) -> Any:
        """Job ``key``'s result, waiting for it, left to be taken."""
        return self._futures[key].result()

    def settle(self) -> None:
        """Wait until every admitted job has finished (results and exceptions stay to be taken)."""
        for future in list(self._futures.values()):
            future.exception()

    def counters(self) -> dict[str, float]:
        """The waits since the last call, then reset: the learner's for results, the sampling thread's for
        admission."""
        with self._cond:
            idle = self._producer_wait
            if self._idle_since is not None:  # idle right now: count up to now
                now = time.perf_counter()
                idle += now - self._idle_since
                self._idle_since = now
            found = {"learner_wait": self._learner_wait, "producer_wait": idle}
            self._learner_wait = self._producer_wait = 0.0
        return found

    def close(self) -> None:
        """Stop the threads; jobs not started are dropped, running ones finish first."""
        with self._cond:
            self._closed = True
            self._jobs.clear()
            self._cond.notify_all()
        self._thread.join()
        self._scoring.shutdown(wait=True, cancel_futures=True)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._jobs and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                future, sample, score = self._jobs.pop(0)
                if self._idle_since is not None:
                    self._producer_wait += time.perf_counter() - self._idle_since
                    self._idle_since = None
            try:
                sampled = sample()
            except BaseException as exc:  # raised in the learner's thread, where the result is taken
                future.set_exception(exc)
            else:
                self._scoring.submit(_finish, future, score, sampled)
            with self._cond:
                self._idle_since = time.perf_counter()


def _finish(future: Future, score: Callable[[Any], Any], sampled: Any) -> None:
    try:
        future.set_result((sampled, score(sampled)))
    except BaseException as exc:
        future.set_exception(exc)
