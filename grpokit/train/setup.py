"""The composition root: building the trainer's parts from user input: the arguments and data, the policy (path,
hub id, loaded model; LoRA), the rewards, the learner (reference, optimizer and its schedule), the rollout engine
and source, and the checks of the data against them.

With :mod:`grpokit.train.specs` (each part's settings as a frozen spec), this is the only code outside the config
package that reads the whole config: every part gets only its own settings."""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from grpokit.algos.registry import get_algorithm
from grpokit.config import ConfigError, GRPOConfig
from grpokit.hardware import pick_device, pick_dtype, slow_dtype_warning
from grpokit.modeling import is_hf_model, load_model, load_tokenizer, lora_config
from grpokit.processes import is_sharded
from grpokit.train import specs
from grpokit.train.learner import Learner
from grpokit.train.reference import Reference
from grpokit.train.run_dir import check_run_dir
from grpokit.train.schedule import fused_adamw, make_scheduler
from grpokit.trl_compat import EIGHT_BIT_OPTIMIZERS, accelerator_settings


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
    tools: Any = None  # the ToolSpec of multi-turn tool rollouts, or None


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
    from grpokit.train.tool_rollouts import (
        PLACEHOLDER_PROMPT,
        check_tool_prompts,
        environment_owned_rows,
        resolve_tools,
    )

    args.validate(procs.world_size)
    if rollout_func is not None:
        check_rollout_func(args, rollout_func, tools, environment_factory)
    if args.engine == "vllm":
        from grpokit.rollout.vllm_engine import check_vllm_environment

        check_vllm_environment(procs.enabled)
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


def rows_loader(args: GRPOConfig, rows: list[dict], train: bool, streaming: bool) -> torch.utils.data.DataLoader:
    """transformers' Trainer data loader over ``rows``: the per-device train or eval batch size, as lists of row
    dicts, ``dataloader_num_workers`` workers; one (0) for a streaming dataset, whose order the workers would
    interleave."""
    batch_size = args.per_device_train_batch_size if train else args.per_device_eval_batch_size
    workers = 0 if streaming else args.dataloader_num_workers
    return torch.utils.data.DataLoader(rows, batch_size=batch_size, num_workers=workers, collate_fn=list)


def eval_sets(eval_dataset: Any, prompt_column: str, prompts=None, default_prompt: list | None = None) -> dict:
    """The eval datasets' rows by name: ``{}`` without one; ``{None: rows}`` for one dataset (a ``datasets.Dataset``
    or ``IterableDataset``, a list of dicts, a path, a ``datasets.load_dataset`` mapping with a ``path``);
    ``{name: rows}`` for a dict of them (TRL's: a dict, ``DatasetDict`` or ``IterableDatasetDict``), each evaluated
    on its own, its metrics named ``eval_<name>_...``. ``prompts``, ``default_prompt``: as ``load_rows`` takes them."""
    from grpokit.config.schema import DATASET_KEYS
    from grpokit.data.prompts import DataError, load_rows

    if eval_dataset is None:
        return {}
    load_spec = type(eval_dataset) is dict and "path" in eval_dataset and set(eval_dataset) <= set(DATASET_KEYS)
    if isinstance(eval_dataset, Mapping) and not load_spec:
        if not eval_dataset:
            raise DataError("eval_dataset is an empty dict; give at least one {name: dataset}, or no eval_dataset.")
        return {
            str(name): load_rows(ds, prompt_column, eval_set_name(str(name)), prompts, default_prompt)
            for name, ds in eval_dataset.items()
        }
    return {None: load_rows(eval_dataset, prompt_column, "eval_dataset", prompts, default_prompt)}


def eval_set_name(name: str | None) -> str:
    """How messages name an eval set: ``eval_dataset``, or ``eval_dataset['name']`` for one of a dict."""
    return "eval_dataset" if name is None else f"eval_dataset[{name!r}]"


def run_processes():
    """``processes.SingleProcess``, or under torchrun the joined process group's ``DistContext``."""
    from grpokit.processes import SingleProcess, under_torchrun

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
    its rows)} of ``evals``, :func:`eval_sets`)."""
    from grpokit.data.prompts import PromptSource

    kw = dict(
        prompt_column=args.prompt_column,
        max_prompt_length=args.max_prompt_length,
        overflow=args.prompt_overflow,
        template_kwargs=args.chat_template_kwargs,  # TRL's
    )
    train = PromptSource(train_rows, tokenizer, seed=args.seed, shuffle=args.shuffle, **kw)
    return train, {name: (PromptSource(rows, tokenizer, shuffle=False, **kw), rows) for name, rows in evals.items()}


def warn_if_too_big(args: GRPOConfig, path: str) -> None:
    """Warn when a model given by path or hub id will not fit (its size is known before it is loaded)."""
    import os

    from grpokit.memory import memory_warning

    processes = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    warning = memory_warning(args, path, pick_device(args.device), processes=processes)
    if warning:
        warnings.warn(f"grpokit: {warning}", stacklevel=3)


def build_optimizer(model: torch.nn.Module, args: GRPOConfig, optimizers: tuple, sharded: bool, device: torch.device):
    """(optimizer, lr scheduler): TRL's ``optimizers=(optimizer, lr_scheduler)`` where given, else AdamW over the
    trainable parameters and ``lr_scheduler_type`` over max_steps x num_iterations x num_mini_batches optimizer
    steps."""
    optimizer, scheduler = optimizers
    if optimizer is not None and sharded:
        raise ConfigError(
            "optimizers=(optimizer, ...) cannot be used with strategy: fsdp, which replaces the parameters "
            "the optimizer holds; leave optimizers out (grpokit's AdamW) or use strategy: ddp."
        )
    optimizer = optimizer or adamw([p for p in model.parameters() if p.requires_grad], args, device)
    total = args.max_steps * args.optimizer_steps_per_step()
    warmup = args.warmup_steps or int(args.warmup_ratio * total)
    return optimizer, scheduler or make_scheduler(optimizer, args.lr_scheduler_type, warmup, total)


def adamw(params: list, args: GRPOConfig, device: torch.device) -> torch.optim.Optimizer:
    """AdamW over ``params`` as ``args.optimizer`` names it: torch's, fused (``schedule.fused_adamw``), or bitsandbytes'
    AdamW8bit (:mod:`grpokit.train.adamw8bit`)."""
    hyper = dict(
        lr=args.learning_rate,
        betas=(args.adam_beta1, args.adam_beta2),
        eps=args.adam_epsilon,
        weight_decay=args.weight_decay,
    )
    if args.optimizer not in EIGHT_BIT_OPTIMIZERS:
        return fused_adamw(params, device, **hyper)
    try:
        from grpokit.train.adamw8bit import AdamW8bit
    except ImportError:
        raise ImportError(f"optimizer: {args.optimizer} needs bitsandbytes: pip install 'grpokit[qlora]'.") from None
    return AdamW8bit(params, **hyper)


def build_learner(
    model,
    args: GRPOConfig,
    *,
    procs,
    device,
    use_lora: bool,
    optimizers: tuple,
    autocast_dtype,
    kernels,
    prompt_tokens: int,
):
    """(reference or None, optimizer, lr scheduler, Learner) of the policy ``model``, wrapped for DDP / FSDP by
    ``procs``; ``prompt_tokens`` (the longest prompt) sizes the update's passes (``memory.update_chunk_rows``). FSDP
    shards in place and replaces the parameters, so it comes before the optimizer sees them; the reference copy is
    sharded the same way (its pass and its resync stay shard by shard). An algorithm with a critic
    (``algos.registry``) gets one (``train.critic.Critic``), built from the policy before any update."""
    from grpokit.memory import update_chunk_rows

    critic = None
    if get_algorithm(args.algorithm).uses_critic:
        from grpokit.train.critic import Critic

        dtype = pick_dtype(args.dtype, device)
        critic = Critic.build(
            model, specs.critic_spec(args), device=device, dtype=dtype, autocast_dtype=autocast_dtype, kernels=kernels
        )
    reference = Reference(model, use_adapters=use_lora) if args.beta > 0 else None
    trained = procs.wrap(model, device, args.strategy)
    if is_sharded(trained) and reference is not None and reference.model is not None:
        procs.wrap(reference.model, device, args.strategy)
    rows = update_chunk_rows(args, model, device, procs.world_size, prompt_tokens)  # before the optimizer's state
    optimizer, scheduler = build_optimizer(model, args, optimizers, is_sharded(trained), device)
    learner = Learner(
        trained,
        reference,
        optimizer,
        scheduler,
        specs.learner_spec(args, rows),
        autocast_dtype=autocast_dtype,
        kernels=kernels,
        critic=critic,
        procs=procs,
    )
    return reference, optimizer, scheduler, learner


def build_rollouts(
    args: GRPOConfig,
    *,
    model,
    tokenizer,
    prompts,
    procs,
    device,
    autocast_dtype,
    source: str | None,
    kernels,
    tools=None,
    rollout_func=None,
):
    """The run's rollout scheduler: the engine named by ``generation.engine`` (``rollout.registry``; ``rollout_func``
    when one is given), the sampler (Ray workers, tool rollouts, raw prompts for an engine that takes them, a seed per
    group, or the engine's one stream) and the source (one step off with ``async_rollouts``, else synchronous) from
    ``train.rollout_sources``. ``source``: the model's folder or hub id when it was given by name (vLLM loads its
    copy from there), else None; ``tools``: the run's ToolSpec, or None; ``rollout_func``: the trainer's
    ``_generate`` when GRPOTrainer was given a rollout_func (it calls the function and checks its output), else None.
    Returns (scheduler, UpdateInputsSpec: how the learner takes the source's rollouts)."""
    from grpokit.modeling import eos_token_ids
    from grpokit.rollout.registry import EngineParts, get_engine
    from grpokit.train.rollout_sources import SAMPLERS, SOURCES
    from grpokit.train.scheduler import RolloutScheduler
    from grpokit.train.tool_rollouts import ToolRollouts

    eos = eos_token_ids(model, tokenizer)
    kind = get_engine(args.engine if rollout_func is None else "rollout_func")
    parts = EngineParts(model, eos, tokenizer.pad_token_id, device, autocast_dtype, kernels, seed=args.seed)
    if rollout_func is None:
        engine = kind.build(parts, specs.vllm_spec(args, source))
    else:
        from grpokit.rollout.rollout_func import RolloutFuncSpec

        engine = kind.build(parts, RolloutFuncSpec(rollout_func))
    sampling = specs.sampling_params(args)
    # multi-turn tool rollouts on the HF engine (the config refuses tools with vLLM and Ray)
    tool_rollouts = (
        None
        if tools is None
        else ToolRollouts(tools, engine, tokenizer, args.prompt_column, args.chat_template_kwargs)  # TRL's kwargs
    )
    common = dict(
        engine=engine,
        prompts=prompts,
        procs=procs,
        model=model,
        num_generations=args.num_generations,
        params=sampling,
        seed=args.seed,
    )
    if args.backend == "ray":  # rank 0 (the only process without torchrun) connects and starts the workers
        sampler = SAMPLERS["ray"](remote=_start_ray(args, parts) if procs.is_main else None, **common)
    elif tool_rollouts is not None:  # groups seeded on their own, decoded in one batch
        sampler = SAMPLERS["tools"](tools=tool_rollouts, **common)
    elif engine.takes_raw_prompts:  # a rollout_func: the prompts as the dataset holds them, in one call
        sampler = SAMPLERS["raw_prompts"](prompt_column=args.prompt_column, **common)
    elif args.seed_per_group or procs.enabled:  # rollouts must not depend on the split over processes
        sampler = SAMPLERS["group_seeded"](**common)
    else:
        sampler = SAMPLERS["engine"](**common)
    if args.async_rollouts:
        rollout_source = SOURCES["one_step_off"](sampler, last_step=args.max_steps)
    else:
        rollout_source = SOURCES["sync"](sampler)
    scheduler = RolloutScheduler(
        source=rollout_source,
        engine=engine,
        prompts=prompts,
        procs=procs,
        prompts_per_step=args.prompts_per_step(procs.world_size),
        sampling=sampling,
        tool_rollouts=tool_rollouts,
    )
    inputs = specs.update_inputs_spec(args, rollout_source.off_policy, kind.separate_weights)
    return scheduler, inputs


def _start_ray(args: GRPOConfig, parts):
    """Connect to Ray (``distributed.address``) and start the rollout workers."""
    from grpokit.distributed.ray_rollout import RayRolloutEngine, connect

    connect(args.address, args.ray_num_cpus)
    return RayRolloutEngine(
        parts.model,
        parts.eos_token_ids,
        parts.pad_token_id,
        args.num_rollout_workers,
        args.rollout_worker_cpus,
        args.rollout_worker_gpus,
        parts.autocast_dtype,
    )


def build_step_sampling(args: GRPOConfig, scheduler, score, pad_token_id: int):
    """How each step samples (``train.dynamic_sampling``): one round, or with ``dynamic_sampling`` rounds until
    the batch holds informative groups; ``score``: the trainer's scoring of a round."""
    from grpokit.train.dynamic_sampling import DynamicRounds, SingleRound

    if not args.dynamic_sampling:
        return SingleRound(scheduler, score)
    return DynamicRounds(
        scheduler,
        score,
        target_groups=args.prompts_per_step(),
        max_rounds=args.max_sampling_rounds,
        num_generations=args.num_generations,
        num_mini_batches=args.num_mini_batches,
        pad_token_id=pad_token_id,
    )


def build_policy(model: Any, tokenizer: Any, args: GRPOConfig, peft_config: Any = None):
    """(model in train mode on its device, tokenizer, device, uses_lora). ``peft_config``: a peft LoraConfig
    used as given (its settings are in ``args.lora`` too, see :func:`lora_settings`)."""
    device = pick_device(args.device)
    dtype = pick_dtype(args.dtype, device)
    slow = slow_dtype_warning(args.dtype, device)
    if slow:
        warnings.warn(f"grpokit: {slow}", stacklevel=3)
    model = model if model is not None else args.model_name_or_path
    if model is None:
        raise ConfigError("no model: pass model=... to GRPOTrainer or set model.model_name_or_path in the config.")
    if args.load_in_4bit and not isinstance(model, str):
        raise ConfigError(
            "load_in_4bit quantises the model while loading it: give its path or hub id (model.model_name_or_path), "
            "not a loaded module."
        )
    if isinstance(model, str):
        name = model
        model = load_model(name, dtype, device, args.trust_remote_code, load_in_4bit=args.load_in_4bit)
        if tokenizer is None:
            tokenizer = load_tokenizer(args.tokenizer_name_or_path or name, args.trust_remote_code)
    elif isinstance(model, torch.nn.Module):
        model = model.to(device=device, dtype=dtype if args.dtype != "auto" else None)
    else:
        raise ConfigError(f"model has type {type(model).__name__}; give a path, a hub id or a torch.nn.Module.")
    if isinstance(tokenizer, str):
        tokenizer = load_tokenizer(tokenizer, args.trust_remote_code)
    if tokenizer is None and args.tokenizer_name_or_path:
        tokenizer = load_tokenizer(args.tokenizer_name_or_path, args.trust_remote_code)
    loaded_from = getattr(getattr(model, "config", None), "_name_or_path", None)
    if tokenizer is None and is_hf_model(model) and loaded_from:  # as TRL: the tokenizer the model was loaded with
        tokenizer = load_tokenizer(loaded_from, args.trust_remote_code)
    if tokenizer is None:
        raise ConfigError(
            "no tokenizer: pass tokenizer=... (an HF tokenizer or any object with encode/decode and eos_token_id)."
        )
    use_lora = args.lora.r > 0
    if use_lora:
        torch.manual_seed(args.seed)  # the adapters' random init (lora_A) follows the seed, not whatever ran before
        model = apply_lora(model, args, peft_config)
    if args.disable_dropout:  # TRL's: no dropout in the policy (nor in its reference copy, made from it)
        for module in model.modules():
            if isinstance(module, torch.nn.Dropout):
                module.p = 0.0
    if args.gradient_checkpointing and not args.load_in_4bit:  # QLoRA's preparation has enabled it already
        # transformers 5 renamed gradient_checkpointing_enable (kept as a deprecated alias)
        enable = getattr(model, "activation_checkpointing_enable", None) or getattr(
            model, "gradient_checkpointing_enable", None
        )
        if enable is not None:
            enable()
    model.train()
    return model, tokenizer, device, use_lora


def apply_lora(model: torch.nn.Module, args: GRPOConfig, peft_config: Any = None) -> torch.nn.Module:
    """Wrap the policy with peft LoRA adapters (Hu et al. 2021): only the adapters train.

    With ``load_in_4bit`` the 4-bit base is first prepared as in QLoRA (peft's
    ``prepare_model_for_kbit_training``: norms in float32, inputs that carry gradients).
    The reference policy is this same model with its adapters disabled (see reference.py).
    """
    try:
        from peft import get_peft_model, prepare_model_for_kbit_training
    except ImportError:
        raise ImportError("lora.r > 0 needs peft: pip install 'grpokit[lora]'.") from None
    if not is_hf_model(model):
        raise ConfigError(
            "LoRA (lora.r > 0) is supported for Hugging Face models; for a custom module, train it fully (lora.r: 0)."
        )
    if args.load_in_4bit:
        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=args.gradient_checkpointing)
    return get_peft_model(model, lora_config(args.lora) if peft_config is None else _causal_lm(peft_config))


def lora_settings(peft_config: Any) -> dict:
    """grpokit's ``lora`` section for a peft ``LoraConfig`` (TRL's ``peft_config=``)."""
    if type(peft_config).__name__ != "LoraConfig" or not hasattr(peft_config, "r"):
        raise ConfigError(
            f"peft_config is a {type(peft_config).__name__}; grpokit trains LoRA adapters: pass a peft.LoraConfig."
        )
    targets = peft_config.target_modules
    if isinstance(targets, (set, frozenset, tuple)):
        targets = sorted(targets)
    return {
        "r": peft_config.r,
        "alpha": peft_config.lora_alpha,
        "dropout": peft_config.lora_dropout,
        "target_modules": targets,
    }


def _causal_lm(peft_config: Any):
    """A copy of ``peft_config`` with task_type CAUSAL_LM when it has none (TRL sets it the same way)."""
    import copy

    if peft_config.task_type is not None:
        return peft_config
    peft_config = copy.deepcopy(peft_config)
    peft_config.task_type = "CAUSAL_LM"
    return peft_config
