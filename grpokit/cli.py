"""Command line: grpokit train | eval | explain | demo | inspect | report."""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="grpokit", description="GRPO-family RL fine-tuning of language models.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("train", help="train from a YAML config", description="Train from a YAML config. Overrides: key=value, section.key=value or --key=value.")
    p.add_argument("config")
    p.add_argument("overrides", nargs=argparse.REMAINDER, help="key=value overrides")
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("eval", help="evaluate a config's model, or a run's final model, on its eval dataset")
    p.add_argument("target", help="a YAML config or a run folder")
    p.add_argument("overrides", nargs=argparse.REMAINDER)
    p.set_defaults(func=cmd_eval)

    p = sub.add_parser("explain", help="print the resolved config and derived sizes, without training")
    p.add_argument("config")
    p.add_argument("overrides", nargs=argparse.REMAINDER)
    p.set_defaults(func=cmd_explain)

    p = sub.add_parser("demo", help="offline CPU demo: teach a small model arithmetic with GRPO")
    p.add_argument("--output-dir", default="runs/demo")
    p.add_argument("--steps", type=int, default=None, help="GRPO steps (default: the example config's)")
    p.add_argument("--rebuild", action="store_true", help="rebuild the cached warm-start policy")
    p.set_defaults(func=cmd_demo)

    from grpokit.store.cli import register

    register(sub)
    args = parser.parse_args(argv)
    from grpokit.config import ConfigError
    from grpokit.data.prompts import DataError
    from grpokit.rewards.contract import RewardError
    from grpokit.train.checkpoint import CheckpointError

    try:
        return int(args.func(args) or 0)
    except (ConfigError, DataError, CheckpointError, RewardError, FileNotFoundError) as exc:
        print(f"grpokit: error: {exc}", file=sys.stderr)
        return 2


def _overrides(items: list[str]) -> list[str]:
    return [x for x in items if x != "--"]


def cmd_train(args) -> int:
    from grpokit.config import load_config
    from grpokit.distributed import exit_process, shutdown_distributed
    from grpokit.train.trainer import GRPOTrainer

    cfg = load_config(args.config, _overrides(args.overrides))
    finished = distributed = False
    try:
        trainer = GRPOTrainer(args=cfg)
        trainer.train()
        finished = trainer.interrupted_by is None
    finally:
        distributed = shutdown_distributed(finished)  # under torchrun: leave the process group before exiting
    if trainer.interrupted_by is not None:
        code = 128 + int(trainer.interrupted_by)  # 130 for SIGINT, 143 for SIGTERM
    else:
        code = 1 if trainer.stop_reason and "non-finite" in trainer.stop_reason else 0
    if distributed:
        exit_process(code)  # a torchrun rank skips the interpreter's teardown (see exit_process)
    return code


def cmd_eval(args) -> int:
    import json

    from grpokit.config import load_config
    from grpokit.train.trainer import GRPOTrainer

    target = Path(args.target)
    if target.is_dir():
        cfg = load_config(target / "config.yaml", _overrides(args.overrides))
        final = target / "final"
        if not final.is_dir():
            raise FileNotFoundError(f"{target} has no final/ model yet; evaluate a finished run, or its config to use the starting model.")
        cfg.model_name_or_path = str(final)
        cfg.resume_from = None
    else:
        cfg = load_config(target, _overrides(args.overrides))
    trainer = GRPOTrainer(args=cfg.replace(output_dir=str(Path(cfg.output_dir) / "eval"), overwrite=True, resume_from=None))
    metrics = trainer.evaluate()
    print(json.dumps(metrics, indent=2))
    return 0


def cmd_explain(args) -> int:
    from grpokit.config import load_config
    from grpokit.explain import explain

    print(explain(load_config(args.config, _overrides(args.overrides))))
    return 0


def cmd_demo(args) -> int:
    from grpokit.demo import run_demo

    result = run_demo(output_dir=args.output_dir, steps=args.steps, rebuild=args.rebuild)
    for key in ("pass1_before", "pass1_after", "pass8_before", "pass8_after", "wall_seconds"):
        print(f"{key}={result[key]:.4f}")  # machine-readable, one key=value per line
    return 0


if __name__ == "__main__":
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    sys.exit(main())
