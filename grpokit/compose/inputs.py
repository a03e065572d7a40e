"""Building the run's inputs: the arguments (TRL's included), the processes, the datasets and their eval sets, the
reward functions, and the checks of the data against them, all before a model loads."""

from __future__ import annotations

import functools
import math
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grpokit.compose import specs
from grpokit.compose.policy import lora_settings
from grpokit.compose.rollouts import engine_kind
from grpokit.config import ConfigError, GRPOConfig
from grpokit.config.trl_keys import accelerator_settings
from grpokit.data.readers import DataReader, eval_set_name, eval_sets
from grpokit.machine.hardware import pick_device, pick_dtype
from grpokit.train.rundir.folder import check_run_dir


def trainer_arguments(args: GRPOConfig | None, peft_config: Any, processing_class: Any, tokenizer: Any):
    """(config, tokenizer or None) from GRPOTrainer's TRL-style arguments: ``processing_class`` and ``tokenizer``
    are one argument; ``peft_config`` (a peft LoraConfig) becomes the config's ``lora`` section."""
    if tokenizer is not None and processing_class is not None and tokenizer is not processing_class:
        raise ConfigError("processing_class and tokenizer are the same argument; pass one of them.")
    args = args or GRPOConfig()
    if peft_config is not None:
        args = args.replace(lora=lora_settings(peft_config))
    return args, processing_class if processing_class is not None else tokenizer


@dataclass(frozen=True)
class Inputs:
    """What the trainer has checked before it loads a model."""

    args: GRPOConfig  # max_steps resolved
    train_rows: list[dict]
    eval_sets: dict  # the eval datasets' rows by name (eval_sets); {} without one
    rewards: Any  # the RewardRunner
    steps_per_epoch: int
    tools: Any  # the ToolSpec of multi-turn tool rollouts, or None


def check_inputs(
    args: GRPOConfig,
    procs,
    train_dataset: Any,
    eval_dataset: Any,
    reward_funcs: Any,
    reward_processing_classes: Any,
    tools: Any = None,
    environment_factory: Any = None,
    rollout_func: Any = None,
) -> Inputs:
    """Everything checked before a model loads, in this order: the config for this many processes (and vLLM's
    environment), the datasets (the arguments, else the config's; without one, an environment that owns the data:
    placeholder prompts its ``reset()`` fills in, for ``max_steps``), the run folder (on rank 0, which owns it), the
    tools and environments (TRL's ``tools`` / ``environment_factory``, else the config's), the reward functions (Ray
    reward workers on rank 0 only: it scores every rank's rows on them; environments' ``get_reward`` added), the
    data against the rewards and the step size. ``max_steps: -1`` becomes num_train_epochs passes over the dataset
    (TRL). Whether the run folder holds a run is not checked here but by ``train()``, which may be told to resume it
    (TRL's ``train(resume_from_checkpoint=True)`` on a new trainer); the CLI checks it before building the trainer.
    ``rollout_func`` (TRL's): checked against the settings it cannot run with (:func:`check_rollout_func`); the data's
    columns are then not checked against the rewards (the function may supply them)."""
    from grpokit.data.prompts import is_streaming, load_rows
    from grpokit.train.experience.tool_rollouts import (
        PLACEHOLDER_PROMPT,
        check_tool_prompts,
        environment_owned_rows,
        resolve_tools,
    )

    args.validate(procs.world_size)
    engine_kind(args.engine)  # a registered engine (rollout/engines.py), before a model loads
    if rollout_func is not None:
        check_rollout_func(args, rollout_func, tools, environment_factory)
    if args.engine == "vllm":
        from grpokit.rollout.vllm_engine import check_vllm_environment

        check_vllm_environment(procs.enabled, pick_device(args.device).type)
    prompts = specs.prompt_builder(args)  # prompt_template, system_prompt, use_chat_template
    has_environment = environment_factory is not None or args.environment_factory is not None
    default_prompt = PLACEHOLDER_PROMPT if has_environment else None
    train_source = train_dataset if train_dataset is not None else args.train_dataset
    if train_source is None:  # the environment owns the data (TRL): its reset() gives each prompt
        train_rows = environment_owned_rows(
            environment_factory if environment_factory is not None else args.environment_factory,
            max_steps=args.max_steps if args.is_given("max_steps") else None,
            prompts_per_step=args.prompts_per_step(procs.world_size),
            prompt_column=args.prompt_column,
        )
    else:  # with an environment, a row may leave its prompt to reset(): an empty user message then (TRL)
        train_rows = load_rows(train_source, args.prompt_column, prompts=prompts, default_prompt=default_prompt)
        if is_streaming(train_source):
            args = streaming_train_args(args)
    eval_source = eval_dataset if eval_dataset is not None else args.eval_dataset
    evals = eval_sets(eval_source, args.prompt_column, prompts, default_prompt)
    if procs.is_main:
        check_run_dir(specs.run_dir_spec(args), existing=False)
    tool_spec = resolve_tools(args.agent, tools, environment_factory, check_settings=args.check_multi_turn)
    if tool_spec is not None:
        check_tool_prompts(train_rows, args.prompt_column)
        for name, rows in evals.items():
            check_tool_prompts(rows, args.prompt_column, eval_set_name(name))
    rewards = build_reward_runner(
        reward_funcs if reward_funcs is not None else args.rewards,
        args,
        ray_workers=procs.is_main,
        processing_classes=reward_processing_classes,
        extra=[] if tool_spec is None else tool_spec.reward_functions(),
    )
    # a rollout_func may supply the columns a reward names (its other keys): checked when the rewards are called
    steps_per_epoch = check_data(args, train_rows, evals, rewards, procs.world_size, columns=rollout_func is None)
    if args.max_steps == -1:
        args = args.replace(max_steps=max(1, math.ceil(args.num_train_epochs * steps_per_epoch)))
    return Inputs(args, train_rows, evals, rewards, steps_per_epoch, tool_spec)


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
    if args.engine != "hf":
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


def streaming_train_args(args: GRPOConfig) -> GRPOConfig:
    """TRL's settings for a streaming (iterable) train dataset: each process reads the stream itself
    (``accelerator_config.dispatch_batches`` False; True is refused, as in TRL) and one worker reads it in order
    (``dataloader_num_workers`` 0), so no group of ``num_generations`` is split."""
    if args.accelerator_config.dispatch_batches:
        raise ConfigError(
            "Iterable datasets require `dispatch_batches=False`: each process reads the stream itself. Remove "
            "dispatch_batches from accelerator_config, or give a map-style datasets.Dataset."
        )
    accelerator = {**accelerator_settings(args.accelerator_config), "dispatch_batches": False}
    with warnings.catch_warnings():  # the user's own accelerator_config was named in the warning already
        warnings.simplefilter("ignore", UserWarning)
        return args.replace(dataloader_num_workers=0, accelerator_config=accelerator)


def run_processes():
    """``processes.SingleProcess``, or under torchrun the joined process group's ``DistContext``."""
    from grpokit.system.processes import SingleProcess, under_torchrun

    if not under_torchrun():
        return SingleProcess()
    from grpokit.distributed.torch_dist import init_distributed

    return init_distributed()


def build_reward_runner(
    reward_funcs: Any,
    args: GRPOConfig,
    ray_workers: bool = True,
    processing_classes: Any = None,
    extra: list | None = None,
):
    """The RewardRunner of ``reward_funcs``. ``ray_workers=False`` (torchrun ranks other than 0): no
    Ray reward workers even with ``num_reward_workers > 0``, since rank 0 scores every rank's rows on them.
    ``processing_classes``: TRL's ``reward_processing_classes`` (a tokenizer or a list, one per function).
    ``extra``: reward functions added after them with weight 1 (environments' ``get_reward``, as TRL adds them)."""
    from grpokit.rewards import RewardRunner

    extra = list(extra or [])
    if (reward_funcs is None or (isinstance(reward_funcs, list) and not reward_funcs)) and not extra:
        raise ConfigError(
            "No reward source provided: pass reward_funcs=... or list them under `rewards:` in the config (e.g. "
            "- accuracy), or an environment_factory whose environment defines get_reward()."
        )
    specs = [] if reward_funcs is None else reward_funcs if isinstance(reward_funcs, list) else [reward_funcs]
    if processing_classes is not None and not isinstance(processing_classes, list):
        processing_classes = [processing_classes]  # TRL: one processing class is the list of one
    if processing_classes is not None and len(processing_classes) != len(specs):
        raise ConfigError(
            f"The number of reward processing classes ({len(processing_classes)}) must match the number of reward "
            f"functions ({len(specs)}); pass reward_processing_classes as a list with one entry per reward function, "
            "in order (None for a plain function)."
        )
    weights = args.reward_weights
    if extra:
        weights = None if weights is None else [*weights, *[1.0] * len(extra)]
        processing_classes = None if processing_classes is None else [*processing_classes, *[None] * len(extra)]
        specs = [*specs, *extra]
    try:
        pool = None  # reward_workers processes in the learner (0 = one each, or none)
        if args.num_reward_workers > 0 and ray_workers:  # Ray reward actors
            from grpokit.distributed.ray_rewards import RayRewardPool

            pool = functools.partial(
                RayRewardPool, workers=args.num_reward_workers, worker_cpus=args.reward_worker_cpus
            )
        device = pick_device(args.device)
        return RewardRunner(
            specs,
            weights=weights,
            timeout=args.reward_timeout,
            workers=0 if args.num_reward_workers > 0 else args.reward_workers,
            isolate=args.reward_isolation,  # None: named rewards isolated, Python functions here (RewardRunner)
            processing_classes=processing_classes,
            pool=pool,
            # reward models named by a string, loaded as TRL loads them, on the policy's device and in its dtype
            model_kwargs={
                "device": device,
                "dtype": pick_dtype(args.dtype, device),
                "trust_remote_code": args.trust_remote_code,
            },
        )
    except (
        ValueError,
        TypeError,
        ImportError,
        OSError,
    ) as exc:  # a bad spec: unknown name, missing file, bad params, not picklable
        raise ConfigError(f"rewards: {exc}") from exc


def check_data(args: GRPOConfig, train_rows: list, evals: dict, rewards, world_size: int, columns: bool = True) -> int:
    """Check the datasets (``evals``: :func:`eval_sets`) against the reward functions' columns (unless ``columns`` is
    False: a rollout_func may supply them) and the step size; returns the steps per epoch (prompts // prompts per
    step: TRL drops a last partial batch too)."""
    from grpokit.data.prompts import DataError, check_reward_columns

    reward_fns = dict(zip(rewards.names, rewards.functions)) if columns else {}
    check_reward_columns(train_rows, reward_fns, args.prompt_column)
    per_step = args.prompts_per_step(world_size)
    if len(train_rows) < per_step:
        raise DataError(
            f"train_dataset has {len(train_rows)} prompts but a step takes {per_step} distinct ones; add prompts or "
            "lower per_device_train_batch_size x gradient_accumulation_steps / num_generations."
        )
    for name, rows in evals.items():
        check_reward_columns(rows, reward_fns, args.prompt_column, eval_set_name(name))
    return len(train_rows) // per_step


def prompt_sources(args: GRPOConfig, tokenizer, train_rows: list, evals: dict):
    """(training PromptSource: seeded order, shuffled per ``shuffle``; {name: (eval PromptSource in dataset order,
    its rows)} of ``evals``, :func:`grpokit.data.readers.eval_sets`)."""
    from grpokit.data.prompts import PromptSource

    train = PromptSource(train_rows, tokenizer, seed=args.seed, shuffle=args.shuffle, **prompt_source_kwargs(args))
    return train, data_reader(args, tokenizer, None).prompt_sources(evals)


def prompt_source_kwargs(args: GRPOConfig) -> dict:
    """How any PromptSource of the run reads its prompts."""
    return dict(
        prompt_column=args.prompt_column,
        max_prompt_length=args.max_prompt_length,
        overflow=args.prompt_overflow,
        template_kwargs=args.chat_template_kwargs,  # TRL's
    )


def data_reader(args: GRPOConfig, tokenizer, rewards) -> DataReader:
    """What reads a dataset given after the build (``trainer.evaluate(eval_dataset=...)``, the data loaders), with
    the run's settings: its own part of the Run, so the trainer never calls back into the builders."""
    return DataReader(
        prompt_column=args.prompt_column,
        prompts=specs.prompt_builder(args),
        source_kwargs=prompt_source_kwargs(args),
        tokenizer=tokenizer,
        reward_fns={} if rewards is None else dict(zip(rewards.names, rewards.functions)),
        train_batch_size=args.per_device_train_batch_size,
        eval_batch_size=args.per_device_eval_batch_size,
        workers=args.dataloader_num_workers,
    )


def served_rewards(targets: list[str]) -> tuple[list, dict[str, Any]]:
    """The rewards list and the reward settings (``reward_*``) of a YAML config (or a YAML list of rewards), or reward
    specs given as they are: what ``grpokit serve-rewards`` serves."""
    if len(targets) == 1 and targets[0].endswith((".yaml", ".yml")):
        import yaml

        path = Path(targets[0])
        if not path.is_file():
            raise ConfigError(f"{path} does not exist; give a YAML config with a rewards: list, or reward names")
        data = yaml.safe_load(path.read_text())
        if isinstance(data, list):
            return data, {}
        if not isinstance(data, dict) or not data.get("rewards"):
            raise ConfigError(f"{path}: no rewards: list to serve")
        settings = data.get("reward") or {}
        return list(data["rewards"]), {k: v for k, v in settings.items() if k.startswith("reward_")}
    return list(targets), {}


def served_reward_runner(targets: list[str], timeout: float | None = None):
    """``grpokit serve-rewards``' RewardRunner: the rewards of :func:`served_rewards`, each in its killable worker
    process, ``timeout`` (default the config's reward_timeout, else 10 s) per batch."""
    from grpokit.rewards import RewardRunner

    rewards, settings = served_rewards(targets)
    return RewardRunner(
        rewards,
        weights=settings.get("reward_weights"),
        timeout=float(timeout or settings.get("reward_timeout", 10.0)),
        workers=int(settings.get("reward_workers", 0)),
        isolate=True,
    )
