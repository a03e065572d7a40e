"""Stopping on SIGINT and SIGTERM.

During training the first signal only sets a flag: the step in progress finishes (its weights,
store rows and metrics stay consistent) and the trainer stops with a checkpoint of it. A second
signal, or one outside the training loop, raises :class:`Interrupted` at once; the CLI turns it
into a one-line message and exit status 128 + the signal number (130 for SIGINT, 143 for SIGTERM).
Checkpoints and store steps are written atomically, so stopping at any point leaves neither torn.

Around the training loop, a command of the CLI has :class:`CommandSignals` from its first line to its last: a
signal raises :class:`Interrupted` (one line, exit 128 + signum), but not inside an import: an exception raised
there leaves the module half-initialised, and libraries turn it into another error (numpy's "cannot load module
more than once per process", transformers' "Could not import module ...") with tracebacks of their own. A signal
that arrives during an import is delivered again as soon as no import is running (a watcher thread sees the main
thread leave it), so cleanup code runs as for any other stop; a second signal meanwhile ends the process at once
(:func:`exit_at_once`), so an import that never finishes cannot hold the process.
"""

from __future__ import annotations

import _thread
import contextlib
import logging
import os
import signal
import sys
import threading
import time
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


# Callbacks Python runs around os.fork (logging's lock helpers, registered with os.register_at_fork): an exception
# raised in them is printed as "Exception ignored" and lost, so a signal waits for them as it waits for an import.
_FORK_CALLBACKS = frozenset(
    fn.__code__
    for fn in (getattr(logging, name, None) for name in ("_acquireLock", "_releaseLock", "_prepareFork", "_afterFork"))
    if fn is not None
)


def importing(frame) -> bool:
    """Whether ``frame`` (a signal handler's) runs inside an import: a frame of importlib's bootstrap is on the
    stack (every ``import`` statement, ``importlib.import_module`` and a C extension's own imports pass there);
    or inside a fork callback, where an exception would be lost."""
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib") or frame.f_code in _FORK_CALLBACKS:
            return True
        frame = frame.f_back
    return False


def exit_at_once(signum: int, message: str | None = None) -> None:
    """End the process now with one line on stderr and exit status 128 + ``signum``: no exception, so no
    library can catch it, rewrap it or print a traceback. For the CLI's own process only (never a library's
    caller): stdout is flushed if it can be, stderr written with one system call (a signal handler may have
    interrupted a write to it)."""
    with contextlib.suppress(Exception):  # a reentrant call, a closed or broken pipe: the line still goes out
        sys.stdout.flush()
    line = f"grpokit: {message or f'stopped by {signal_name(signum)}'}\n"
    try:
        os.write(2, line.encode(errors="replace"))
    finally:
        os._exit(128 + signum)


class CommandSignals:
    """SIGINT and SIGTERM for the whole of a CLI command (the trainer's :class:`SignalStop` takes over while it
    trains). ``signum`` records the first signal, so whatever a library makes of the :class:`Interrupted`, the
    CLI still reports the signal. A signal inside an import waits for it to end (module docstring).
    ``finish()``: the command is over (its result written), so from then on a signal ends the process at once,
    through the interpreter's teardown too."""

    # How often the watcher looks whether the main thread is still importing.
    POLL_SECONDS = 0.01

    def __init__(self):
        self.signum: int | None = None
        self._waiting: int | None = None  # a signal that arrived during an import, not delivered yet
        self._redelivered = False  # the watcher is delivering it again (not a second signal from outside)

    def install(self) -> dict:
        """Handle SIGINT and SIGTERM here; returns the previous handlers for :func:`restore`."""
        return install(self)

    def __call__(self, signum: int, frame) -> None:
        if self.signum is None:
            self.signum = signum
        redelivered, self._redelivered = self._redelivered, False
        if importing(frame):
            if self._waiting is not None and not redelivered:  # a second signal while the first waits
                exit_at_once(signum)
            self._waiting = signum
            threading.Thread(target=self._deliver_after_import, name="grpokit-signal", daemon=True).start()
            return
        self._waiting = None
        raise Interrupted(signum)

    def _deliver_after_import(self) -> None:
        """Wait until the main thread runs outside any import, then deliver the waiting signal there again."""
        main = threading.main_thread().ident
        while self._waiting is not None:
            frame = sys._current_frames().get(main)
            if frame is None:  # the main thread has ended
                return
            if not importing(frame):
                self._redelivered = True
                _thread.interrupt_main(self._waiting)  # runs __call__ in the main thread, as the signal would
                return
            del frame
            time.sleep(self.POLL_SECONDS)

    def finish(self) -> None:
        install(lambda signum, frame: exit_at_once(signum))


def guard_start_up() -> None:
    """The first line of ``python -m grpokit``: a signal before the CLI's own handlers are in place (while
    grpokit.cli and what it needs are imported) ends the process with one line instead of a traceback."""
    install(lambda signum, frame: exit_at_once(signum))


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
