"""`grpokit inspect RUN ...`: a run's stored rollouts (a summary, completions, or a read-only SQL query). It only reads
the run folder, so it works on a finished run on read-only storage; a StoreError reaches the user as one line."""

from __future__ import annotations

import argparse

from grpokit.system.io_errors import write_stdout


def register(subparsers: argparse._SubParsersAction) -> None:
    inspect = subparsers.add_parser(
        "inspect",
        help="show a run's stored rollouts",
        description="Show a run's rollouts: a per-step summary by default, completions with "
        "--step/--top/--bottom/--prompt/--errors, or any read-only --sql query "
        "(tables: rollouts, step_metrics, evals, steps, prompt_history; views: reward_values, "
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
    inspect.add_argument(
        "--prompts",
        action="store_true",
        help="each training prompt's history: pass rate, mean reward, reward variance, samples, first and last step",
    )
    inspect.add_argument(
        "--sort",
        choices=("prompt", "pass_rate", "last_step", "samples"),
        default="prompt",
        help="with --prompts: by prompt index (default), pass rate (lowest first), last step or samples (most first)",
    )
    inspect.set_defaults(func=run_inspect)


def run_inspect(args: argparse.Namespace) -> int:
    from grpokit.store.inspect import inspect_run

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
        prompts=args.prompts,
        sort=args.sort,
    )
    write_stdout(output)
    return 0
