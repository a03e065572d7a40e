"""Stopping on SIGINT and SIGTERM.

During training the first signal only sets a flag: the step in progress finishes (its weights,
store rows and metrics stay consistent) and the trainer stops with a checkpoint of it. A second
signal, or one outside the training loop, raises :class:`Interrupted` at once; the CLI turns it
into a one-line message and exit status 128 + the signal number (130 for SIGINT, 143 for SIGTERM).
Checkpoints and store steps are written atomically, so stopping at any point leaves neither torn.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(KeyboardInterrupt):
    """A stop by signal that cannot wait for the step in progress; ``signum`` gives the exit status."""

    def __init__(self, signum: int, message: str | None = None):
        self.signum = signum
        self.message = message or f"stopped by {signal_name(signum)}"
        super().__init__(self.message)


def signal_name(signum: int) -> str:
    return signal.Signals(signum).name


def stop_message(signum: int, step: int) -> str:
    """Why a run stopped at ``step`` after signal ``signum``, and what was saved."""
    name = signal_name(signum)
    if step:
        return f"received {name}; saved checkpoint step-{step}, resume with resume_from=latest"
    return f"received {name} before the first step finished; there was nothing to save"


def raise_interrupted(signum: int, frame) -> None:
    """A signal handler that stops at once."""
    raise Interrupted(signum)


def install(handler: Callable) -> dict:
    """Set ``handler`` for SIGINT and SIGTERM; returns the previous handlers for :func:`restore`.

    Signal handlers can only be set from the main thread; elsewhere nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    return {s: signal.signal(s, handler) for s in SIGNALS}


def restore(previous: dict) -> None:
    for s, h in previous.items():
        signal.signal(s, h)


class SignalStop:
    """A training run's SIGINT / SIGTERM handling: the first signal is recorded in ``signum`` (the loop
    finishes the step in progress, then stops with its checkpoint); a second raises :class:`Interrupted`
    at once, naming the step in progress and the last checkpoint, which ``progress()`` returns as
    (step, saved step; 0 = none). ``enabled=False`` (torchrun ranks other than 0) installs nothing."""

    def __init__(self, progress: Callable[[], tuple[int, int]], enabled: bool = True):
        self.progress = progress
        self.enabled = enabled
        self.signum: int | None = None
        self._previous: dict = {}

    def __enter__(self) -> SignalStop:
        if self.enabled:
            self._previous = install(self._on_signal)
        return self

    def __exit__(self, *exc) -> None:
        restore(self._previous)
        self._previous = {}

    def _on_signal(self, signum: int, frame) -> None:
        if self.signum is None:
            self.signum = signum
            return
        step, saved = self.progress()
        last = f"checkpoint step-{saved}" if saved else "no checkpoint"
        raise Interrupted(
            signum,
            f"stopped at once by a second {signal_name(signum)}, during step {step}; "
            f"the last saved state is {last} (resume_from=latest)",
        )
