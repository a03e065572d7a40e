"""`grpokit report RUN [--open]`: write RUN/report.html, or where `--output` says, or, when the run folder cannot be
written, a file in the temporary folder, saying so. It only reads the run's store."""

from __future__ import annotations

import argparse
import contextlib
import errno
import os
import sys
import tempfile
import webbrowser
from pathlib import Path

from grpokit.store.errors import StoreError
from grpokit.system.io_errors import storage_errno, write_stdout

# The run folder refused report.html for one of these: write it to the temporary folder instead.
_FALL_BACK_ON = {errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOSPC, errno.EDQUOT}


def register(subparsers: argparse._SubParsersAction) -> None:
    report = subparsers.add_parser(
        "report",
        help="write RUN/report.html (curves, samples)",
        description="Write RUN/report.html: the run's summary, curves and best and worst completions. When the "
        "run folder cannot be written (read-only storage, a full disk), the report goes to the temporary folder "
        "and the command says where.",
    )
    report.add_argument("run", help="run folder")
    report.add_argument("--output", "-o", metavar="FILE", help="write the report here instead of RUN/report.html")
    report.add_argument(
        "--steps",
        type=_step_list,
        metavar="N,M",
        help="the steps the Groups view and the best and worst completions show (default: the first, middle and "
        "last, and evenly spaced others in the Groups view)",
    )
    report.add_argument("--open", action="store_true", help="open the report in a browser")
    report.set_defaults(func=run_report)


def _step_list(text: str) -> list[int]:
    try:
        steps = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a list of step numbers: write e.g. --steps 1,50,100"
        ) from None
    if not steps:
        raise argparse.ArgumentTypeError("--steps needs at least one step number, e.g. --steps 1,50,100")
    return steps


def run_report(args: argparse.Namespace) -> int:
    from grpokit.store.report import REPORT_FILENAME, report_page, write_page

    path = Path(args.output) if args.output is not None else Path(args.run) / REPORT_FILENAME
    page = report_page(args.run, args.steps, path.parent)  # its images linked from where the page lies
    try:
        write_page(path, page)
    except OSError as exc:
        if args.output is not None or storage_errno(exc) not in _FALL_BACK_ON:
            raise
        page = report_page(args.run, args.steps, Path(tempfile.gettempdir()))  # the fallback's images' links
        path = _fall_back(Path(args.run), path, page, exc)
    write_stdout(f"wrote {path}\n")
    if args.open:
        webbrowser.open(path.resolve().as_uri())
    return 0


def write_fallback_report(run: Path, page: str) -> Path:
    """Write the report of ``run`` when its folder cannot be written: a new file in the temporary folder, made by
    ``tempfile.mkstemp`` (a name nobody can guess and claim first, readable by its owner only), named after the run;
    returns its path. An OSError leaves no file behind."""
    fd, name = tempfile.mkstemp(prefix=f"grpokit-report-{_safe_name(run.resolve().name)}-", suffix=".html")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(page)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(name)
        raise
    return Path(name)


def _safe_name(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)[:60] or "run"


def _fall_back(run: Path, refused: Path, page: str, exc: OSError) -> Path:
    cause = exc.strerror or str(exc)
    try:
        fallback = write_fallback_report(run, page)
    except OSError as again:
        raise StoreError(
            f"cannot write {refused} ({cause}) nor a report in {tempfile.gettempdir()} ({again.strerror or again}); "
            "choose a writable place with --output FILE"
        ) from again
    print(
        f"grpokit: {refused} cannot be written ({cause}); wrote the report to {fallback} instead "
        "(--output FILE chooses where)",
        file=sys.stderr,
    )
    return fallback
