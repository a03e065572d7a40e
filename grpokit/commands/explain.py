"""`grpokit explain CONFIG [key=value ...]`: the resolved config and derived sizes, without training
(commands/explanation.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

from grpokit.commands.running import run_config
from grpokit.commands.user_errors import command_overrides


def register(sub) -> None:
    p = sub.add_parser("explain", help="print the resolved config and derived sizes, without training")
    p.add_argument("config", help="a YAML config or a run folder")
    p.add_argument("overrides", nargs=argparse.REMAINDER, help="key=value settings that replace the config's")
    p.set_defaults(func=run_explain)


def run_explain(args) -> int:
    from grpokit.commands.explanation import explain
    from grpokit.config import load_config

    path = Path(args.config)
    print(explain(load_config(run_config(path) if path.is_dir() else path, command_overrides(args.overrides))))
    return 0
