"""Command line: parses and dispatches to the subcommands of grpokit/commands/ (one module each, :data:`COMMANDS`).

Every way out of a command is one line on stderr, never a traceback, besides a bug's: a signal (exit 128 + signum,
from the first line of ``main`` to the interpreter's last, imports included: ``interrupt.CommandSignals``), an error
grpokit raises on purpose and a file the storage would not read or write (``grpokit: error: ...``, exit 2).
"""

from __future__ import annotations

import sys

from grpokit.commands.user_errors import is_user_error  # light: its imports are in the function
from grpokit.train import interrupt  # signal handling only: no heavy import comes before the handlers


def main(argv: list[str] | None = None) -> int:
    """Run the command in ``argv`` (default: the process's arguments) and return its exit status.

    Without ``argv`` main owns the process (the console script, ``python -m grpokit``): its signal handlers stay
    until the process ends. With ``argv`` (a call from Python) the caller's handlers are restored on return."""
    signals = interrupt.CommandSignals()
    previous = signals.install()  # first, before anything that imports numpy, torch or transformers
    if argv is None:
        _ask_for_huge_pages()
    try:
        return _run(argv, signals)
    except BaseException:  # while parsing the arguments (argparse's SystemExit), or a bug re-raised
        signals.finish()  # what remains is reporting: a signal now ends the process at once
        if signals.signum is None:
            raise
        return _stopped(signals.signum)  # a signal, whatever a library made of it
    finally:
        signals.finish()
        if argv is not None:
            interrupt.restore(previous)


def _ask_for_huge_pages() -> None:
    """The CLI owns its process: PyTorch backs its CPU tensors of 2 MB or more with transparent huge pages
    (``grpokit.kernels.allocator``), unless the environment already says (``THP_MEM_ALLOC_ENABLE=0`` turns it off).
    PyTorch reads the variable at its first allocation, so this comes before torch is imported (the CLI imports it
    in the commands)."""
    import os

    os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")  # allocator.HUGE_PAGES_ENV; importing it would import torch


def _run(argv: list[str] | None, signals: interrupt.CommandSignals) -> int:
    """Parse ``argv``, run the command, and turn each way it can fail into one line and an exit status."""
    args = build_parser().parse_args(argv)
    try:
        code = int(args.func(args) or 0)
    except BaseException as exc:
        signals.finish()
        return _failed(exc, signals.signum)
    signals.finish()
    if signals.signum is None or code >= 128:  # no signal, or one the command has reported (the trainer's stop)
        return code
    return _stopped(signals.signum)  # its Interrupted was swallowed (a library's except BaseException)


def _failed(exc: BaseException, signum: int | None) -> int:
    """One line and the exit status for ``exc``, which ended a command; re-raises a bug."""
    if isinstance(exc, interrupt.Interrupted):
        print(f"grpokit: {exc.message}", file=sys.stderr)
        return 128 + exc.signum
    if signum is not None or isinstance(exc, KeyboardInterrupt):  # whatever a library made of the signal
        # (KeyboardInterrupt alone: Python's own SIGINT handler, when main() runs outside the main thread)
        return _stopped(signum or 2)
    if isinstance(exc, BrokenPipeError):  # `grpokit inspect RUN | head`: the reader has all it wants
        _silence_stdout()
        return 141  # as a shell reports a process ended by SIGPIPE
    if is_user_error(exc):
        print(f"grpokit: error: {exc}", file=sys.stderr)
        return 2
    from grpokit.system.io_errors import storage_error_line

    line = storage_error_line(exc)
    if line is None:
        raise exc
    print(f"grpokit: error: {line}", file=sys.stderr)
    return 2


def _stopped(signum: int) -> int:
    print(f"grpokit: stopped by {interrupt.signal_name(signum)}", file=sys.stderr)
    return 128 + signum


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so the interpreter's last flush does not fail on the closed pipe again."""
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


# The subcommands, in --help's order: each a module of grpokit/commands/ with register(subparsers), which adds its
# parser and sets func(args) -> exit code.
COMMANDS = (
    "train",
    "eval",
    "explain",
    "demo",
    "env",
    "serve_rewards",
    "vllm_serve",
    "inspect",
    "report",
    "compare",
    "doctor",
)


def build_parser():
    """grpokit's argument parser: every command of :data:`COMMANDS`, from its own module."""
    import argparse
    import importlib

    from grpokit.version import __version__

    parser = argparse.ArgumentParser(prog="grpokit", description="GRPO-family RL fine-tuning of language models.")
    parser.add_argument("--version", action="version", version=f"grpokit {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in COMMANDS:
        importlib.import_module(f"grpokit.commands.{name}").register(sub)
    return parser


if __name__ == "__main__":
    sys.exit(main())
