"""The `inspect` and `report` subcommands; grpokit/cli.py adds them with `register(subparsers)`.

Their StoreErrors reach the user as `grpokit: error: ...` (exit 2) through grpokit/cli.py's main."""

from __future__ import annotations

import argparse
import sys
import webbrowser

from grpokit.store.inspect import inspect_run
from grpokit.store.report import write_report


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
    inspect.set_defaults(func=run_inspect)

    report = subparsers.add_parser("report", help="write RUN/report.html (curves, samples)")
    report.add_argument("run", help="run folder")
    report.add_argument("--open", action="store_true", help="open the report in a browser")
    report.set_defaults(func=run_report)


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
    )
    sys.stdout.write(output)
    return 0


def run_report(args: argparse.Namespace) -> int:
    path = write_report(args.run)
    print(f"wrote {path}")
    if args.open:
        webbrowser.open(path.resolve().as_uri())
    return 0
