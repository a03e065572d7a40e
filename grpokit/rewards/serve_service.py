"""``grpokit serve-rewards``' scoring service: a request admitted to the queue, its body read, parsed on a parse
thread and scored in its turn on the batch thread (:class:`~grpokit.rewards.serve_queue.TurnQueue`), off the
server's event loop. The answers' format is :mod:`grpokit.rewards.serve`'s docstring."""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from grpokit.rewards.serve_queue import ServerMetrics, TurnQueue
from grpokit.rewards.serve_requests import grpokit_request, openrlhf_request, parse_body

if TYPE_CHECKING:
    from grpokit.rewards.runner import RewardRunner

EMPTY = {"rewards": [], "errors": [], "extra": {}, "metrics": {}, "per_reward": {}}


def _json_value(value: float) -> float | None:
    return None if value is None or not math.isfinite(value) else value


class RewardService:
    """Scores requests with one runner, one batch at a time, in turn (at most ``max_queue`` admitted)."""

    def __init__(self, runner: RewardRunner, max_queue: int = 16):
        self.runner = runner
        self.queue = TurnQueue(max_queue)
        self.metrics = ServerMetrics()
        self._parse = ThreadPoolExecutor(2, thread_name_prefix="grpokit-reward-parse")
        self.served = 0

    def score(self, prompts: list, completions: list, columns: dict[str, list]) -> dict[str, Any]:
        """The answer of one batch (blocking: the batch thread calls it in the request's turn)."""
        values = self.runner.score_values(prompts, completions, columns)
        result = self.runner.combine(values)
        self.served += 1
        return {
            "rewards": [_json_value(v) for v in result.combined.tolist()],
            "errors": result.errors,
            "extra": json.loads(json.dumps(result.extra, default=str)),
            "metrics": {k: [_json_value(v) for v in vs] for k, vs in result.logged.items()},
            "per_reward": {
                name: [_json_value(v) for v in result.per_func[:, f].tolist()] for f, name in enumerate(result.names)
            },
        }

    @staticmethod
    def request(route: str, data: bytes) -> tuple[list, list, dict[str, list]]:
        """(prompts, completions, columns) of a body (BadRequest when it is not one)."""
        value = parse_body(data)
        return openrlhf_request(value) if route == "openrlhf" else grpokit_request(value)

    async def answer(self, route: str, body: Callable[[], Awaitable[bytes]]) -> dict[str, Any]:
        """Admit a request (503 when full), then read its ``body``, check it and score it in its turn."""
        began = time.monotonic()
        self.queue.admit()
        loop = asyncio.get_running_loop()
        try:
            data = await body()
            prompts, completions, columns = await loop.run_in_executor(self._parse, self.request, route, data)
        except BaseException:
            self.queue.leave()
            raise
        if not completions:
            self.queue.leave()
            answer = dict(EMPTY)
        else:
            future = self.queue.run(lambda: self.score(prompts, completions, columns))
            try:
                answer = await asyncio.wrap_future(future)
            except asyncio.CancelledError:
                if future.cancelled():  # never started: its place is given back
                    self.queue.leave()
                raise
            errors = sum(e is not None for e in answer["errors"])
            self.metrics.scored(time.monotonic() - began, len(completions), errors)
        if route != "openrlhf":
            return answer
        return {"rewards": answer["rewards"], "scores": answer["rewards"], "extra_logs": answer["per_reward"]}

    def close(self) -> None:
        self._parse.shutdown(wait=True)
        self.queue.close()
