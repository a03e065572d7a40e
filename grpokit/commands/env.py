"""`grpokit env`: versions, hardware and what grpokit picks here, for bug reports (commands/env_report.py)."""

from __future__ import annotations


def register(sub) -> None:
    p = sub.add_parser("env", help="print versions, hardware and what grpokit picks here (for bug reports)")
    p.add_argument("--probe", action="store_true", help="measure the CPU's compute paths again (new hardware)")
    p.set_defaults(func=run_env)


def run_env(args) -> int:
    from grpokit.commands.env_report import format_report, report

    print(format_report(report(probe=args.probe)))
    return 0
