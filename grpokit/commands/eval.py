"""`grpokit eval TARGET [key=value ...]`: evaluate a config's model, or a run's final model, on its eval dataset."""

from __future__ import annotations

import argparse
from pathlib import Path

from grpokit.commands.running import keep_freed_memory_on_cpu, quietly, run_config
from grpokit.commands.user_errors import command_overrides


def register(sub) -> None:
    p = sub.add_parser("eval", help="evaluate a config's model, or a run's final model, on its eval dataset")
    p.add_argument("target", help="a YAML config or a run folder")
    p.add_argument("overrides", nargs=argparse.REMAINDER, help="key=value settings that replace the config's")
    p.set_defaults(func=quietly(run_eval))


def run_eval(args) -> int:
    """Evaluate and print the metrics as JSON. Nothing is written: the trainer's output_dir is a temporary folder
    (it only has to pass the run-folder check), so a finished run on read-only storage evaluates too."""
    import json
    import tempfile

    from grpokit.config import ConfigError
    from grpokit.trl.trainer import GRPOTrainer

    cfg, model = eval_inputs(Path(args.target), command_overrides(args.overrides))
    if cfg.eval_dataset is None:
        raise ConfigError(f"{args.target} sets no data.eval_dataset; add one (or pass eval_dataset=PATH) to evaluate.")
    keep_freed_memory_on_cpu(cfg.device)
    with tempfile.TemporaryDirectory(prefix="grpokit-eval-") as scratch:
        trainer = GRPOTrainer(
            model=model,  # None: the config's model_name_or_path
            args=cfg.replace(output_dir=str(Path(scratch) / "eval"), resume_from=None),
        )
        try:
            metrics = trainer.evaluation_metrics()  # grpokit's names, as metrics.jsonl has them
        finally:
            trainer.rewards.close()  # the reward worker processes
            trainer.run.evaluator.reward_runner.close()  # eval_rewards' (the same runner without them)
    from grpokit.system.io_errors import write_stdout

    write_stdout(json.dumps(metrics, indent=2) + "\n")
    return 0


def eval_inputs(target: Path, overrides: list[str]):
    """(config, model or None) of `grpokit eval`: a YAML config as it is (its starting model, loaded by the trainer),
    or a run folder's config with its final model. A LoRA run's final/ holds the adapter: it is loaded onto its base
    and merged here (peft), and the run's lora section dropped, since new adapters on top would start from zero and
    be evaluated in place of the trained ones (a QLoRA run's adapter is merged into the unquantised base)."""
    from grpokit.config import load_config

    if not target.is_dir():
        return load_config(target, overrides), None
    cfg = load_config(run_config(target), overrides)
    final = target / "final"
    if not final.is_dir():
        raise FileNotFoundError(
            f"{target} has no final/ model yet; evaluate a finished run, or its config to use the starting model."
        )
    cfg.model_name_or_path = str(final)
    cfg.resume_from = None
    if not (final / "adapter_config.json").is_file():
        return cfg, None
    from peft import AutoPeftModelForCausalLM

    from grpokit.machine.hardware import pick_device, pick_dtype

    dtype = pick_dtype(cfg.dtype, pick_device(cfg.device))  # the training run's weights dtype
    model = AutoPeftModelForCausalLM.from_pretrained(str(final), dtype=dtype, trust_remote_code=cfg.trust_remote_code)
    tokenizer = cfg.tokenizer_name_or_path or str(final)  # final/ holds the run's tokenizer
    merged = model.merge_and_unload().requires_grad_(True)  # a plain model, as a full fine-tuning run's (peft froze it)
    return cfg.replace(r=0, load_in_4bit=False, tokenizer_name_or_path=tokenizer), merged
