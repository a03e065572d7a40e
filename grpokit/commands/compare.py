"""`grpokit compare RUN_A RUN_B [...]`: runs side by side (config difference, final evaluation, held-out prompts,
curves) in the terminal and a page."""

from __future__ import annotations

import argparse
from pathlib import Path

from grpokit.store.errors import StoreError
from grpokit.system.io_errors import write_stdout


def register(subparsers: argparse._SubParsersAction) -> None:
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


def run_compare(args: argparse.Namespace) -> int:
    from grpokit.store.compare import load_run
    from grpokit.store.compare_page import compare_lines, compare_page
    from grpokit.store.report import write_page

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
