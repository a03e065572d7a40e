"""The trainer's arguments before anything is built: TRL's arguments folded into the config, the processes of the run
(one, or a torchrun rank), and a rollout_func's compatibility with the run's settings."""

from __future__ import annotations

from typing import Any

from grpokit.compose.policy import lora_settings
from grpokit.config import ConfigError, GRPOConfig


def trainer_arguments(args: GRPOConfig | None, peft_config: Any, processing_class: Any, tokenizer: Any):
    """(config, tokenizer or None) from GRPOTrainer's TRL-style arguments: ``processing_class`` and ``tokenizer``
    are one argument; ``peft_config`` (a peft LoraConfig) becomes the config's ``lora`` section."""
    if tokenizer is not None and processing_class is not None and tokenizer is not processing_class:
        raise ConfigError("processing_class and tokenizer are the same argument; pass one of them.")
    args = args or GRPOConfig()
    if peft_config is not None:
        args = args.replace(lora=lora_settings(peft_config))
    return args, processing_class if processing_class is not None else tokenizer


def run_processes():
    """``processes.SingleProcess``, or under torchrun the joined process group's ``DistContext``."""
    from grpokit.system.processes import SingleProcess, under_torchrun

    if not under_torchrun():
        return SingleProcess()
    from grpokit.distributed.torch_dist import init_distributed

    return init_distributed()


def check_rollout_func(args: GRPOConfig, rollout_func: Any, tools: Any, environment_factory: Any) -> None:
    """Refuse, in one line naming the fix, what TRL's ``rollout_func`` cannot run with here: something not callable,
    tools or environments (both generate the completions), another engine than the default (vLLM, transformers'
    generate) and Ray rollout workers (the function runs in the training process, where the trainer it is given
    lives)."""
    if not callable(rollout_func):
        raise ConfigError(
            f"rollout_func is a {type(rollout_func).__name__}; pass a function fn(prompts, trainer) -> dict with "
            "prompt_ids, completion_ids and logprobs."
        )
    if tools or environment_factory is not None or args.agent.tools or args.agent.environment_factory is not None:
        raise ConfigError(
            "rollout_func generates the completions itself, and so do tools / environment_factory; pass one of them "
            "(a rollout_func runs its own tool or environment loop and marks the environment's tokens with env_mask)."
        )
    if args.engine not in ("hf", "auto"):  # auto: the function samples; no engine is resolved
        raise ConfigError(
            f"rollout_func generates the completions itself, so it cannot be combined with generation.engine: "
            f"{args.engine} (use_vllm or generation_kwargs); remove that setting (the function may call your own "
            "vLLM server)."
        )
    if args.backend == "ray":
        raise ConfigError(
            "rollout_func runs in the training process and cannot be combined with distributed.backend: ray (Ray "
            "rollout workers); remove that setting."
        )
