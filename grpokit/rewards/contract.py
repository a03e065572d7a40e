"""The reward-function contract (TRL's), and calling one function on one batch.

A reward function is called with keywords only, as TRL's GRPOTrainer calls it::

    fn(prompts=..., completions=..., completion_ids=..., trainer_state=...,
       log_metric=..., log_extra=..., **columns) -> list[float | None]

``columns`` are the dataset's other columns, each a list aligned with ``completions``;
``completion_ids`` are lists of ints; ``trainer_state`` has ``global_step``, ``max_steps`` and
``epoch``; ``log_metric(name, value)`` adds a scalar to the step's metrics and
``log_extra(column, values)`` a column to the stored rollouts; ``log_errors(messages)``, given only to a function
that names it, says why a completion got None (stored and counted as a failure, as a raise is). A function takes
what it names and ``**kwargs`` for the rest; one without ``**kwargs`` gets only the keywords it names. ``None``
means "does not apply". It may be a coroutine function.

Conversational data (prompts that are lists of chat messages): ``prompts`` are those lists and each
completion is ``[{"role": "assistant", "content": text}]``; a multi-turn tool rollout's completion is its
messages after the prompt (assistant turns with their ``tool_calls``, ``tool`` results), as TRL passes them.
Runs with an ``environment_factory`` pass ``environments`` too: each completion's environment instance, live
(:data:`LIVE_KEYWORDS`), so a function that names it runs in the trainer's process.

Two kinds of failure are told apart on purpose:

- a function that raises or runs past its timeout is a per-batch accident: the batch gets
  ``None`` and the error is recorded, and training goes on;
- a function that breaks the contract (wrong number of values, non-numbers) or is misconfigured
  (a column it needs is missing) raises :class:`RewardError`, which stops the run at once,
  because every later batch would fail the same way.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import numbers
import threading
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from grpokit.system.workers import TIMED_OUT

RewardFn = Callable[..., Any]
# Keywords holding live objects of the trainer's process (TRL's ``environments``): never sent to a worker
# process; a function that names one runs on a thread of the trainer (:func:`reads_live_objects`).
LIVE_KEYWORDS = ("environments",)


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
            f"reward {reward!r} needs the dataset column {column!r}; the columns given are {sorted(columns)}"
        )
    return columns[column]


@dataclass
class RewardState:
    """What ``trainer_state`` tells a reward function (the fields of transformers' TrainerState
    that TRL's rewards read): optimizer steps done, steps planned, epochs of the data consumed."""

    global_step: int
    max_steps: int
    epoch: float


def is_conversational(prompt: Any) -> bool:
    """A prompt given as chat messages: a list of dicts with a ``role``."""
    return isinstance(prompt, list) and all(isinstance(m, Mapping) and "role" in m for m in prompt)


def as_completions(prompts: Sequence[Any], texts: Sequence[Any]) -> list[Any]:
    """Completions in the form TRL passes them: ``[{"role": "assistant", "content": text}]`` each
    when the prompts are chat messages, else the texts. A completion given as messages already (a
    multi-turn rollout's) stays as it is."""
    if prompts and is_conversational(prompts[0]):
        return [text if is_conversational(text) else [{"role": "assistant", "content": text}] for text in texts]
    return list(texts)


def text_of(item: Any) -> str:
    """The text of a prompt or completion: a string as it is, chat messages as their contents
    joined by newlines (what built-in rewards read)."""
    if isinstance(item, str):
        return item
    if is_conversational(item):
        return "\n".join(str(m.get("content", "")) for m in item)
    return str(item)


def texts_of(items: Sequence[Any]) -> list[str]:
    return [text_of(item) for item in items]


@dataclass
class RewardLog:
    """What one call logged through ``log_metric`` and ``log_extra``, for ``n`` completions."""

    n: int
    metrics: dict[str, list[float]] = field(default_factory=dict)
    extra: dict[str, list] = field(default_factory=dict)
    errors: list[str | None] | None = None

    def log_errors(self, messages: Sequence[str | None]) -> None:
        """Why each completion got None (one message or None per completion): a reward that fails on some
        completions only (a remote server down for part of the batch) stores these as the runner stores a raise."""
        if len(messages) != self.n:
            raise ValueError(f"log_errors(messages) needs one message or None per completion ({self.n})")
        self.errors = [None if m is None else str(m) for m in messages]

    def log_metric(self, name: str, value: float) -> None:
        """Add ``value`` to the step's metric ``name`` (the step logs the mean of its values)."""
        try:
            number = float(value)  # a Python, numpy or one-element torch number
        except (TypeError, ValueError):
            number = None
        if not isinstance(name, str) or number is None:
            raise TypeError(f"log_metric(name, value) takes a str and a number, got {name!r}, {value!r}")
        self.metrics.setdefault(name, []).append(number)

    def log_extra(self, column: str, values: Sequence[Any]) -> None:
        """Store ``values`` (one per completion of the batch) as ``column`` with the rollouts."""
        if hasattr(values, "tolist"):
            values = values.tolist()
        sized = hasattr(values, "__len__") and not isinstance(values, (str, bytes, Mapping))
        if not isinstance(column, str) or not sized or len(values) != self.n:
            got = f"{len(values)} values" if sized else f"a {type(values).__name__}"
            raise ValueError(
                f"log_extra({column!r}, values) needs a list of one value per completion ({self.n}), got {got}"
            )
        self.extra[column] = list(values)


@dataclass
class Outcome:
    """One function's call on one batch (or chunk): its raw ``output``, or an ``error`` message
    (with the ``traceback`` text when it raised), what it logged, a :class:`RewardError` it
    raised (``fatal``), which the runner raises again, and the call's wall time in ``seconds`` (None: the
    call never returned: timed out, or its worker died)."""

    output: Any = None
    error: str | None = None
    traceback: str | None = None
    log: RewardLog | None = None
    fatal: RewardError | None = None
    seconds: float | None = None


def _accepted(fn: RewardFn) -> set[str] | None:
    """The keywords ``fn`` names, or None when it takes ``**kwargs`` (or has no signature)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return None
    named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return {p.name for p in params if p.kind in named}


def _names(fn: RewardFn, keyword: str) -> bool:
    try:
        return keyword in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def reads_live_objects(fn: RewardFn) -> bool:
    """Whether ``fn`` names one of :data:`LIVE_KEYWORDS` (so it must run in the trainer's process)."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return any(name in params for name in LIVE_KEYWORDS)


def call_reward(fn: RewardFn, payload: Mapping[str, Any], log: RewardLog) -> Any:
    """Call ``fn`` once with the keywords of ``payload`` plus ``log_metric`` / ``log_extra``; an
    awaitable result is run to completion with asyncio.run (a fresh loop: this runs on a worker
    thread or process, which has none of its own)."""
    kwargs = {**payload, "log_metric": log.log_metric, "log_extra": log.log_extra}
    if _names(fn, "log_errors"):  # grpokit's own keyword: only for functions that ask for it by name
        kwargs["log_errors"] = log.log_errors
    accepted = _accepted(fn)
    if accepted is not None:
        kwargs = {k: v for k, v in kwargs.items() if k in accepted}
    output = fn(**kwargs)
    if inspect.isawaitable(output):
        output = asyncio.run(_await(output))
    return output


async def _await(awaitable: Any) -> Any:
    return await awaitable


def run_call(fn: RewardFn, payload: Mapping[str, Any], n: int) -> Outcome:
    """``call_reward`` with every failure caught into the :class:`Outcome`."""
    log = RewardLog(n)
    started = time.perf_counter()
    try:
        output = call_reward(fn, payload, log)
    except RewardError as exc:
        return Outcome(log=log, fatal=exc)
    except BaseException as exc:
        error = f"{type(exc).__name__}: {exc}"
        return Outcome(error=error, traceback=_user_traceback(exc), log=log, seconds=time.perf_counter() - started)
    seconds = time.perf_counter() - started
    if hasattr(output, "tolist"):  # numpy / torch: plain values, cheap to send between processes
        output = output.tolist()
    return Outcome(output=output, log=log, seconds=seconds)


def _user_traceback(exc: BaseException) -> str:
    """The traceback of ``exc`` from the reward function's frame on (this module's frames left out)."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(exc), exc, tb))


class TimedCall:
    """One reward call started on a daemon thread in this process, abandoned past its timeout.

    Python cannot kill a thread, so an abandoned call keeps running in the background until it
    returns (a call that holds the GIL stalls this process meanwhile); being a daemon thread it
    never blocks interpreter exit. Worker processes (:mod:`grpokit.system.workers`) are killed instead.
    """

    def __init__(self, fn: RewardFn, payload: Mapping[str, Any], n: int):
        self._outcome: Outcome | None = None
        self._started = time.monotonic()
        self._thread = threading.Thread(target=self._run, args=(fn, payload, n), daemon=True)
        self._thread.start()

    def _run(self, fn: RewardFn, payload: Mapping[str, Any], n: int) -> None:
        self._outcome = run_call(fn, payload, n)

    def result(self, timeout: float) -> Outcome:
        """Wait until ``timeout`` seconds after the start; a call still running is timed out."""
        self._thread.join(max(0.0, self._started + timeout - time.monotonic()))
        if self._thread.is_alive():
            return Outcome(error=f"{TIMED_OUT} after {timeout:g} s")
        return self._outcome


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
            f"reward {name!r} must return a list of {n} numbers or None, got {type(output).__name__}: {_short(output)}"
        )
    if len(output) != n:
        raise RewardError(f"reward {name!r} returned {len(output)} values for {n} completions: {_short(output)}")
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


def failed_outcome(message: str) -> Outcome:
    """The Outcome of a call a worker process could not answer (:class:`grpokit.system.workers.WorkerProcess`)."""
    return Outcome(error=message)
