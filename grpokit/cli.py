"""Command line: grpokit train | eval | explain | demo | inspect | report | env."""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="grpokit", description="GRPO-family RL fine-tuning of language models.")
    from grpokit import __version__

    parser.add_argument("--version", action="version", version=f"grpokit {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser(
        "train",
        help="train from a YAML config",
        description="Train from a YAML config. Overrides: key=value, section.key=value or --key=value.",
    )
    p.add_argument("config", help="a YAML config (every key: docs/config.md)")
    p.add_argument("overrides", nargs=argparse.REMAINDER, help="key=value settings that replace the config's")
    p.set_defaults(func=_quietly(cmd_train))

    p = sub.add_parser("eval", help="evaluate a config's model, or a run's final model, on its eval dataset")
    p.add_argument("target", help="a YAML config or a run folder")
    p.add_argument("overrides", nargs=argparse.REMAINDER, help="key=value settings that replace the config's")
    p.set_defaults(func=_quietly(cmd_eval))

    p = sub.add_parser("explain", help="print the resolved config and derived sizes, without training")
    p.add_argument("config", help="a YAML config or a run folder")
    p.add_argument("overrides", nargs=argparse.REMAINDER, help="key=value settings that replace the config's")
    p.set_defaults(func=cmd_explain)

    p = sub.add_parser("demo", help="offline CPU demo: teach a small model arithmetic with GRPO")
    p.add_argument("--output-dir", default="runs/demo", help="the run folder (default: runs/demo)")
    p.add_argument("--steps", type=int, default=None, help="GRPO steps (default: the example config's)")
    p.add_argument("--rebuild", action="store_true", help="rebuild the cached warm-start policy")
    p.set_defaults(func=_quietly(cmd_demo))

    p = sub.add_parser("env", help="print versions, hardware and what grpokit picks here (for bug reports)")
    p.set_defaults(func=cmd_env)

    from grpokit.store.cli import register

    register(sub)
    args = parser.parse_args(argv)
    from grpokit.train import interrupt

    previous = interrupt.install(interrupt.raise_interrupted)  # the trainer has its own handler while it trains
    try:
        return int(args.func(args) or 0)
    except interrupt.Interrupted as exc:
        print(f"grpokit: {exc.message}", file=sys.stderr)
        return 128 + exc.signum
    except KeyboardInterrupt:  # Python's own SIGINT handler: main() runs outside the main thread
        print("grpokit: stopped by SIGINT", file=sys.stderr)
        return 128 + signal.SIGINT
    except Exception as exc:
        if not is_user_error(exc):
            raise
        print(f"grpokit: error: {exc}", file=sys.stderr)
        return 2
    finally:
        interrupt.restore(previous)


def is_user_error(exc: BaseException) -> bool:
    """Errors grpokit raises on purpose, with a message that names the problem and the fix: the CLI prints
    them as one line (exit 2) instead of a traceback. An ImportError raised by grpokit to name a missing
    extra has no module name; one from a failed import statement has it and stays a traceback."""
    from grpokit.config import ConfigError
    from grpokit.data.prompts import DataError
    from grpokit.rewards.contract import RewardError
    from grpokit.store.store import StoreError
    from grpokit.train.checkpoint import CheckpointError

    if isinstance(exc, ImportError):
        return exc.name is None
    return isinstance(exc, (ConfigError, DataError, CheckpointError, StoreError, RewardError, FileNotFoundError))


def _overrides(items: list[str]) -> list[str]:
    return [x for x in items if x != "--"]


def _quietly(command):
    """``command`` (one that loads a model) run with transformers' own progress bars off: see
    :func:`_quiet_model_loading`."""

    def run(args) -> int:
        _quiet_model_loading()
        return command(args)

    return run


def _quiet_model_loading() -> None:
    """Turn off transformers' own progress bars ("Loading weights", "Loading checkpoint shards", "Writing model
    shards"): drawn on stderr between a run's log lines, they break them up and tell a log nothing. Downloads keep
    huggingface_hub's bars (a first run of a hub model shows its progress); ``HF_HUB_DISABLE_PROGRESS_BARS=0``
    keeps every bar. The CLI owns its process; the library leaves a Python user's settings alone."""
    from huggingface_hub import constants
    from huggingface_hub.utils import are_progress_bars_disabled, enable_progress_bars
    from transformers.utils import logging as transformers_logging

    if constants.HF_HUB_DISABLE_PROGRESS_BARS is False:  # the user asked for every bar
        return
    downloads = not are_progress_bars_disabled()
    transformers_logging.disable_progress_bar()  # turns off huggingface_hub's bars too,
    if downloads:
        enable_progress_bars()  # which downloads keep


def _keep_freed_memory_on_cpu(device: str) -> None:
    """The CLI owns its process: on CPU, let glibc keep freed memory for the next step
    (:func:`grpokit.kernels.keep_freed_memory`; the library never changes its caller's allocator)."""
    from grpokit.hardware import pick_device
    from grpokit.kernels import keep_freed_memory

    try:
        cpu = pick_device(device).type == "cpu"
    except RuntimeError:  # an unavailable device: the trainer reports it
        return
    if cpu:
        keep_freed_memory()


def cmd_train(args) -> int:
    from grpokit.config import load_config
    from grpokit.processes import under_torchrun
    from grpokit.train.trainer import GRPOTrainer

    cfg = load_config(args.config, _overrides(args.overrides))
    _keep_freed_memory_on_cpu(cfg.device)
    finished = distributed = False
    try:
        trainer = GRPOTrainer(args=cfg)
        trainer.train()
        finished = trainer.interrupted_by is None
    finally:
        if under_torchrun():  # leave the process group before exiting
            from grpokit.distributed import shutdown_distributed

            distributed = shutdown_distributed(finished)
    if trainer.interrupted_by is not None:
        code = 128 + int(trainer.interrupted_by)  # 130 for SIGINT, 143 for SIGTERM
    else:
        code = 1 if trainer.stop_reason and "non-finite" in trainer.stop_reason else 0
    if distributed:
        from grpokit.distributed import exit_process

        exit_process(code)  # a torchrun rank skips the interpreter's teardown (see exit_process)
    return code


def cmd_eval(args) -> int:
    import json

    from grpokit.config import ConfigError, load_config
    from grpokit.train.trainer import GRPOTrainer

    target = Path(args.target)
    if target.is_dir():
        cfg = load_config(_run_config(target), _overrides(args.overrides))
        final = target / "final"
        if not final.is_dir():
            raise FileNotFoundError(
                f"{target} has no final/ model yet; evaluate a finished run, or its config to use the starting model."
            )
        cfg.model_name_or_path = str(final)
        cfg.resume_from = None
    else:
        cfg = load_config(target, _overrides(args.overrides))
    if cfg.eval_dataset is None:
        raise ConfigError(f"{args.target} sets no data.eval_dataset; add one (or pass eval_dataset=PATH) to evaluate.")
    _keep_freed_memory_on_cpu(cfg.device)
    trainer = GRPOTrainer(
        args=cfg.replace(output_dir=str(Path(cfg.output_dir) / "eval"), overwrite=True, resume_from=None)
    )
    metrics = trainer.evaluate()
    print(json.dumps(metrics, indent=2))
    return 0


def cmd_explain(args) -> int:
    from grpokit.config import load_config
    from grpokit.explain import explain

    path = Path(args.config)
    print(explain(load_config(_run_config(path) if path.is_dir() else path, _overrides(args.overrides))))
    return 0


def _run_config(run: Path) -> Path:
    """RUN/config.yaml of a run folder, or a ConfigError saying the folder is not one."""
    from grpokit.config import ConfigError

    config = run / "config.yaml"
    if not config.is_file():
        raise ConfigError(
            f"{run} is a folder without config.yaml, so not a grpokit run folder; give a run folder "
            "(the output_dir of `grpokit train`) or a YAML config."
        )
    return config


def cmd_demo(args) -> int:
    from grpokit.demo import run_demo

    _keep_freed_memory_on_cpu("auto")  # the demo's config leaves the device to auto
    result = run_demo(output_dir=args.output_dir, steps=args.steps, rebuild=args.rebuild)
    for key in ("pass1_before", "pass1_after", "pass8_before", "pass8_after", "wall_seconds"):
        print(f"{key}={result[key]:.4f}")  # machine-readable, one key=value per line
    return 0


def cmd_env(args) -> int:
    from grpokit.env import format_report, report

    print(format_report(report()))
    return 0


if __name__ == "__main__":
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    sys.exit(main())
