"""The reward-function contract, and calling one function safely.

A reward function is ``fn(prompts, completions, **columns) -> list[float | None]``: ``columns``
are the dataset's other columns, each a list aligned with ``completions``; ``None`` means "does
not apply". It may be a coroutine function. It must accept keyword columns it does not use.

Two kinds of failure are told apart on purpose:

- a function that raises or runs past its timeout is a per-batch accident: the batch gets
  ``None`` and the error is recorded, and training goes on;
- a function that breaks the contract (wrong number of values, non-numbers) or is misconfigured
  (a column it needs is missing) raises :class:`RewardError`, which stops the run at once,
  because every later batch would fail the same way.
"""

from __future__ import annotations

import asyncio
import math
import numbers
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

RewardFn = Callable[..., Any]
TIMED_OUT = "timed out"


class RewardError(ValueError):
    """A reward function broke the contract or is misconfigured; raised at once, never swallowed."""


class MissingColumnError(RewardError, KeyError):
    """A reward needs a dataset column that was not given."""

    def __str__(self) -> str:
        # KeyError quotes its message; this one is a sentence.
        return str(self.args[0])


def require_column(columns: Mapping[str, Any], column: str, reward: str) -> Sequence[Any]:
    """Return ``columns[column]``, or raise :class:`MissingColumnError` naming it."""
    if column not in columns:
        raise MissingColumnError(
            f"reward {reward!r} needs the dataset column {column!r}; "
            f"the columns given are {sorted(columns)}"
        )
    return columns[column]


async def _await(awaitable: Any) -> Any:
    return await awaitable


def call_reward(
    fn: RewardFn, prompts: list[str], completions: list[str], columns: Mapping[str, list]
) -> Any:
    """Call ``fn`` once on a batch; an awaitable result is run to completion with asyncio.run."""
    output = fn(prompts, completions, **columns)
    if hasattr(output, "__await__"):
        # A fresh event loop per call: this runs on a worker thread, which has none of its own.
        output = asyncio.run(_await(output))
    return output


class TimedCall:
    """One reward call started on a daemon thread, abandoned if it runs past its timeout.

    Python cannot kill a thread, so an abandoned call keeps running in the background until it
    returns; being a daemon thread it never blocks interpreter exit. With worker processes
    (``RewardRunner(workers=N)``) the process pool is recycled after a timeout, which ends it.
    """

    def __init__(
        self, fn: RewardFn, prompts: list[str], completions: list[str], columns: Mapping[str, list]
    ):
        self._output: Any = None
        self._exception: BaseException | None = None
        self._started = time.monotonic()
        self._thread = threading.Thread(
            target=self._run, args=(fn, prompts, completions, columns), daemon=True
        )
        self._thread.start()

    def _run(self, fn, prompts, completions, columns) -> None:
        try:
            self._output = call_reward(fn, prompts, completions, columns)
        except BaseException as exc:  # noqa: BLE001 - any failure of user code is reported
            self._exception = exc

    def result(self, timeout: float) -> tuple[Any, str | None]:
        """Wait until ``timeout`` seconds after the start; return ``(output, error message)``.

        Raises the function's own :class:`RewardError` (a contract or configuration error).
        """
        self._thread.join(max(0.0, self._started + timeout - time.monotonic()))
        if self._thread.is_alive():
            return None, f"{TIMED_OUT} after {timeout:g} s"
        if isinstance(self._exception, RewardError):
            raise self._exception
        if self._exception is not None:
            return None, f"{type(self._exception).__name__}: {self._exception}"
        return self._output, None


def check_output(name: str, output: Any, n: int) -> tuple[list[float | None], list[str | None]]:
    """Validate one function's output for ``n`` completions.

    Returns the values as floats (``None`` kept) and a per-completion error message
    (``"returned nan"`` / ``"returned inf"``: a non-finite value counts as ``None`` plus an error).
    ``bool`` counts as a number. Raises :class:`RewardError` for a wrong count or a non-number.
    """
    if hasattr(output, "tolist"):
        output = output.tolist()
    if isinstance(output, (str, bytes, Mapping)) or not isinstance(output, Sequence):
        raise RewardError(
            f"reward {name!r} must return a list of {n} numbers or None, "
            f"got {type(output).__name__}: {_short(output)}"
        )
    if len(output) != n:
        raise RewardError(
            f"reward {name!r} returned {len(output)} values for {n} completions: {_short(output)}"
        )
    values: list[float | None] = []
    errors: list[str | None] = []
    for value in output:
        if value is None:
            values.append(None)
            errors.append(None)
            continue
        if not isinstance(value, (numbers.Real, np.bool_)):
            raise RewardError(
                f"reward {name!r} returned a {type(value).__name__} ({_short(value)}) "
                "where a number or None was expected"
            )
        value = float(value)
        finite = math.isfinite(value)
        values.append(value if finite else None)
        errors.append(None if finite else f"returned {value}")
    return values, errors


def _short(value: Any, limit: int = 200) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."
