"""The `inspect` and `report` subcommands; grpokit/cli.py adds them with `register(subparsers)`.

Their StoreErrors reach the user as `grpokit: error: ...` (exit 2) through grpokit/cli.py's main. Both only read
the run folder, so they work on a finished run on read-only storage; `report` writes RUN/report.html, or where
`--output` says, or, when the run folder cannot be written, a file in the temporary folder, saying so.
"""

from __future__ import annotations

import argparse
import errno
import hashlib
import sys
import tempfile
import webbrowser
from pathlib import Path

from grpokit.store.inspect import inspect_run
from grpokit.store.report import REPORT_FILENAME, report_page, write_page
from grpokit.store.store import StoreError
from grpokit.system.io_errors import storage_errno, write_stdout

# The run folder refused report.html for one of these: write it to the temporary folder instead.
_FALL_BACK_ON = {errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOSPC, errno.EDQUOT}


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `inspect RUN ...` and `report RUN [--open]`; each sets `func(args) -> exit code`."""
    inspect = subparsers.add_parser(
        "inspect",
        help="show a run's stored rollouts",
        description="Show a run's rollouts: a per-step summary by default, completions with "
        "--step/--top/--bottom/--prompt/--errors, or any read-only --sql query "
        "(tables: rollouts, step_metrics, evals, steps; views: reward_values, "
        "step_summary).",
    )
    inspect.add_argument("run", help="run folder (holding rollouts.sqlite)")
    inspect.add_argument("--step", type=int, help="only this step's completions")
    best_worst = inspect.add_mutually_exclusive_group()
    best_worst.add_argument("--top", type=int, metavar="K", help="the K highest rewarded")
    best_worst.add_argument("--bottom", type=int, metavar="K", help="the K lowest rewarded")
    inspect.add_argument("--prompt", type=int, metavar="ID", help="only this prompt_index")
    inspect.add_argument("--errors", action="store_true", help="only completions whose reward raised an error")
    inspect.add_argument(
        "--sql",
        metavar="QUERY",
        help='a read-only query, e.g. "SELECT name, avg(value) FROM reward_values GROUP BY name"',
    )
    inspect.add_argument("--json", action="store_true", help="print JSON instead of a table")
    inspect.add_argument(
        "--tokens",
        action="store_true",
        help="each completion's tokens with the per-token values kept (run.store_token_values); with --step, --prompt",
    )
    inspect.set_defaults(func=run_inspect)

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

    compare = subparsers.add_parser(
        "compare",
        help="compare runs: config difference, final evaluation, held-out prompts, curves",
        description="Compare two or more runs: the config keys that differ, each run's final evaluation with its "
        "delta to the first run, the held-out prompts one run solves and another does not, and (in the page) the "
        "curves overlaid by step and by wall time. A run that is missing or cannot be read is left out with a line; "
        "a run still being written is compared as of its last step.",
    )
    compare.add_argument("runs", nargs="+", metavar="RUN", help="run folders (the first is the baseline)")
    compare.add_argument("--output", "-o", metavar="FILE", default="compare.html", help="the page (compare.html)")
    compare.set_defaults(func=run_compare)


def run_inspect(args: argparse.Namespace) -> int:
    output = inspect_run(
        args.run,
        step=args.step,
        top=args.top,
        bottom=args.bottom,
        prompt=args.prompt,
        errors=args.errors,
        sql=args.sql,
        as_json=args.json,
        tokens=args.tokens,
    )
    write_stdout(output)
    return 0


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
    path = Path(args.output) if args.output is not None else Path(args.run) / REPORT_FILENAME
    page = report_page(args.run, args.steps, path.parent)
    try:
        write_page(path, page)
    except OSError as exc:
        if args.output is not None or storage_errno(exc) not in _FALL_BACK_ON:
            raise
        page = report_page(args.run, args.steps, fallback_report_path(Path(args.run)).parent)  # its images' links
        path = _fall_back(Path(args.run), path, page, exc)
    write_stdout(f"wrote {path}\n")
    if args.open:
        webbrowser.open(path.resolve().as_uri())
    return 0


def run_compare(args: argparse.Namespace) -> int:
    from grpokit.store.compare import load_run
    from grpokit.store.compare_page import compare_lines, compare_page

    if len(args.runs) < 2:
        raise StoreError("compare needs at least two run folders: grpokit compare RUN_A RUN_B [...]")
    paths = [Path(run) for run in args.runs]
    names = [p.name for p in paths]
    # two folders of the same name (runs/a/run, runs/b/run) are told apart by the paths as given
    loaded = [load_run(p, p.name if names.count(p.name) == 1 else str(p)) for p in paths]
    runs, left_out = [r for r in loaded if r.problem is None], [r for r in loaded if r.problem is not None]
    if len(runs) < 2:
        problems = "; ".join(r.problem for r in left_out)
        raise StoreError(f"compare needs two readable runs, and {len(runs)} could be read: {problems}")
    write_stdout("\n".join(compare_lines(runs, left_out)) + "\n")
    path = Path(args.output)
    write_page(path, compare_page(runs, left_out))
    write_stdout(f"wrote {path}\n")
    return 0


def fallback_report_path(run: Path) -> Path:
    """Where the report of ``run`` goes when its folder cannot be written: the temporary folder, named after the
    run (and a hash of its full path, so two runs of the same name do not overwrite each other's)."""
    digest = hashlib.sha1(str(run.resolve()).encode()).hexdigest()[:8]
    return Path(tempfile.gettempdir()) / f"grpokit-report-{run.resolve().name}-{digest}.html"


def _fall_back(run: Path, refused: Path, page: str, exc: OSError) -> Path:
    fallback = fallback_report_path(run)
    cause = exc.strerror or str(exc)
    try:
        write_page(fallback, page)
    except OSError as again:
        raise StoreError(
            f"cannot write {refused} ({cause}) nor {fallback} ({again.strerror or again}); "
            "choose a writable place with --output FILE"
        ) from again
    print(
        f"grpokit: {refused} cannot be written ({cause}); wrote the report to {fallback} instead "
        "(--output FILE chooses where)",
        file=sys.stderr,
    )
    return fallback
