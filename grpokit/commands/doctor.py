"""`grpokit doctor [--groups N] CONFIG [key=value ...]` (options go before the config: what follows it are
overrides): build the run as `grpokit train` would, check it (grpokit/doctor/), and print a line per check; exit 1
when a check failed."""

from __future__ import annotations

import argparse
import time

from grpokit.commands.user_errors import command_overrides, is_user_error


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "doctor",
        help="check a setup before training: data, templates, tokens, sampler-learner parity, rewards, resources",
        description="Check a config before training: its data and prompt lengths, EOS and pad, the chat template "
        "(renders, prefix-preserving), token round trips, the sampler-learner log-prob gap, the rewards (time, None "
        "and error rates, spread, zero-variance groups), memory and time per step. One line per check, with the "
        "fix on a failure; exit status 1 when a check failed. Writes nothing.",
    )
    p.add_argument("config", help="a YAML config (as `grpokit train` takes)")
    p.add_argument("overrides", nargs=argparse.REMAINDER, help="key=value settings that replace the config's")
    p.add_argument("--groups", type=int, default=4, help="groups of G completions to sample (default 4); before CONFIG")
    p.set_defaults(func=run_doctor)


def run_doctor(args: argparse.Namespace) -> int:
    from grpokit.config import load_config

    started = time.perf_counter()
    cfg = load_config(args.config, command_overrides(args.overrides))
    lines, code = check_config(cfg, groups=max(1, args.groups))
    print("\n".join(lines))
    print(f"doctor took {time.perf_counter() - started:.1f} s")
    return code


def check_config(cfg, groups: int = 4) -> tuple[list[str], int]:
    """(the lines, the exit status) of every check of the config ``cfg``: the run built as `grpokit train` builds it,
    or one failed line naming grpokit's own error."""
    from grpokit.compose.run import build_run
    from grpokit.doctor.checks import doctor, refused

    try:
        run = build_run(cfg)
    except Exception as exc:
        if not is_user_error(exc):
            raise
        return refused(str(exc))
    return doctor(run, groups)
