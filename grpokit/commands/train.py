"""`grpokit train CONFIG [key=value ...]`: train from a YAML config."""

from __future__ import annotations

import argparse

from grpokit.commands.running import keep_freed_memory_on_cpu, quietly
from grpokit.commands.user_errors import command_overrides


def register(sub) -> None:
    p = sub.add_parser(
        "train",
        help="train from a YAML config",
        description="Train from a YAML config. Overrides: key=value, section.key=value or --key=value.",
    )
    p.add_argument("config", help="a YAML config (every key: docs/config.md)")
    p.add_argument("overrides", nargs=argparse.REMAINDER, help="key=value settings that replace the config's")
    p.set_defaults(func=quietly(run_train))


def run_train(args) -> int:
    import os

    from grpokit.compose.specs import part_settings
    from grpokit.config import load_config
    from grpokit.system.processes import under_torchrun
    from grpokit.train.rundir.folder import RunDirSpec, check_run_dir
    from grpokit.trl.trainer import GRPOTrainer

    cfg = load_config(args.config, command_overrides(args.overrides))
    if os.environ.get("RANK", "0") == "0":  # rank 0 owns the run folder (GRPOTrainer checks it again in train())
        check_run_dir(
            part_settings(RunDirSpec, cfg, config=cfg.to_dict())
        )  # a folder holding another run is refused before the model loads
    keep_freed_memory_on_cpu(cfg.device)
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
