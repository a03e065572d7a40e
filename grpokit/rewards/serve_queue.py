"""``grpokit serve-rewards``' queue and its ``/metrics`` (Prometheus text format, version 0.0.4).

:class:`TurnQueue` scores one batch at a time on one worker thread, in the order the requests' bodies were read
and checked (first come, first served, whichever trainer sent them), and admits at most ``bound`` requests: a request
takes its place before its body is read, so the bodies in memory are bounded too. One more is refused at once with
503 and a ``Retry-After`` of the expected wait: ``ceil(mean seconds per batch x (waiting + 1))``, at least 1.

:class:`ServerMetrics` counts what the server answered; ``render`` gives::

    grpokit_reward_requests_total{route, code}   requests answered, by route (score, openrlhf, health, metrics,
                                                 other) and status
    grpokit_reward_rejected_total                requests refused with 503 because the queue was full
    grpokit_reward_completions_total             completions scored
    grpokit_reward_completion_errors_total       completions with an error (a reward that failed on them)
    grpokit_reward_queue_waiting                 requests waiting for their turn now
    grpokit_reward_queue_scoring                 batches being scored now (0 or 1)
    grpokit_reward_latency_seconds               histogram of scoring requests' time, queue wait included
"""

from __future__ import annotations

import math
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

from grpokit.rewards.serve_requests import BadRequest

T = TypeVar("T")
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)


class TurnQueue:
    """One batch at a time on one worker thread, in the order bodies were ready, ``bound`` admitted at most
    (module docstring). A request is admitted (:meth:`admit`) before its body is read, so at most ``bound`` bodies
    are read, parsed or waiting at once; it then runs in its turn (:meth:`run`) or gives its place up
    (:meth:`leave`)."""

    def __init__(self, bound: int):
        if bound < 0:
            raise ValueError(f"the queue bound must be >= 0, got {bound}")
        self.bound = bound
        self.waiting = 0
        self.scoring = 0
        self._counts = threading.Lock()
        self._batch_seconds: list[float] = []  # the last few batches' scoring times, for Retry-After
        self.lock = threading.Lock()  # held while a batch is scored: stopping waits on it
        self._worker = ThreadPoolExecutor(1, thread_name_prefix="grpokit-reward-batch")  # FIFO: one at a time

    def retry_after(self) -> int:
        recent = self._batch_seconds[-8:]
        mean = sum(recent) / len(recent) if recent else 1.0
        return max(1, math.ceil(mean * (self.waiting + 1)))

    def admit(self) -> None:
        """Take a place (BadRequest 503 with Retry-After when ``bound`` are admitted already)."""
        with self._counts:
            if self.waiting >= self.bound and (self.scoring or self.waiting):
                wait = self.retry_after()
                raise BadRequest(
                    503,
                    f"the server is busy ({self.waiting} waiting, --max-queue {self.bound}): retry in {wait} s",
                    {"Retry-After": str(wait)},
                )
            self.waiting += 1

    def leave(self) -> None:
        """Give an admitted place up without a turn (its body was bad, empty or never came)."""
        with self._counts:
            self.waiting -= 1

    def run(self, work: Callable[[], T]) -> Future[T]:
        """``work`` in the admitted request's turn, on the batch thread; first run first served."""
        return self._worker.submit(self._turn, work)

    def _turn(self, work: Callable[[], T]) -> T:
        with self._counts:
            self.waiting -= 1
            self.scoring = 1
        began = time.monotonic()
        try:
            with self.lock:
                return work()
        finally:
            with self._counts:
                self._batch_seconds = [*self._batch_seconds[-7:], time.monotonic() - began]
                self.scoring = 0

    def close(self) -> None:
        """Wait for the batches handed over, then end the batch thread."""
        self._worker.shutdown(wait=True)


class ServerMetrics:
    """Counters of the answers, rendered in Prometheus' text format (module docstring)."""

    def __init__(self):
        self._lock = threading.Lock()
        self.requests: Counter[tuple[str, int]] = Counter()
        self.rejected = 0
        self.completions = 0
        self.completion_errors = 0
        self.buckets = [0] * len(BUCKETS)
        self.latency_sum = 0.0
        self.latency_count = 0

    def answered(self, route: str, status: int) -> None:
        with self._lock:
            self.requests[(route, status)] += 1
            self.rejected += status == 503

    def scored(self, seconds: float, completions: int, errors: int) -> None:
        with self._lock:
            self.completions += completions
            self.completion_errors += errors
            self.latency_sum += seconds
            self.latency_count += 1
            for i, bound in enumerate(BUCKETS):
                self.buckets[i] += seconds <= bound

    def render(self, queue: TurnQueue) -> str:
        with self._lock:
            lines = [
                "# HELP grpokit_reward_requests_total Requests answered, by route and HTTP status.",
                "# TYPE grpokit_reward_requests_total counter",
                *(
                    f'grpokit_reward_requests_total{{route="{route}",code="{code}"}} {count}'
                    for (route, code), count in sorted(self.requests.items())
                ),
                *_scalar("rejected_total", "counter", "Requests refused with 503: the queue was full.", self.rejected),
                *_scalar("completions_total", "counter", "Completions scored.", self.completions),
                *_scalar(
                    "completion_errors_total", "counter", "Completions a reward failed on.", self.completion_errors
                ),
                *_scalar("queue_waiting", "gauge", "Requests waiting for their turn.", queue.waiting),
                *_scalar("queue_scoring", "gauge", "Batches being scored.", queue.scoring),
                "# HELP grpokit_reward_latency_seconds Seconds per scoring request, queue wait included.",
                "# TYPE grpokit_reward_latency_seconds histogram",
                *(
                    f'grpokit_reward_latency_seconds_bucket{{le="{bound:g}"}} {count}'
                    for bound, count in zip(BUCKETS, self.buckets)
                ),
                f'grpokit_reward_latency_seconds_bucket{{le="+Inf"}} {self.latency_count}',
                f"grpokit_reward_latency_seconds_sum {self.latency_sum:.6f}",
                f"grpokit_reward_latency_seconds_count {self.latency_count}",
            ]
        return "\n".join(lines) + "\n"


def _scalar(name: str, kind: str, help_text: str, value: float) -> list[str]:
    return [
        f"# HELP grpokit_reward_{name} {help_text}",
        f"# TYPE grpokit_reward_{name} {kind}",
        f"grpokit_reward_{name} {value}",
    ]
