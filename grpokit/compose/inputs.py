"""The run's inputs, checked before a model loads (:func:`check_inputs`): the datasets and their eval sets, the
reward functions and the tools, each built by its own module (arguments.py, datasets.py, rewards.py)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from grpokit.compose import specs
from grpokit.compose.arguments import check_rollout_func
from grpokit.compose.datasets import check_data, streaming_train_args
from grpokit.compose.rewards import build_reward_runner
from grpokit.compose.rollouts import engine_kind
from grpokit.config import GRPOConfig
from grpokit.config.rules import engine_settings
from grpokit.data.readers import eval_set_name, eval_sets
from grpokit.machine.hardware import pick_device
from grpokit.rollout.engine_choice import is_auto
from grpokit.train.rundir.folder import RunDirSpec, check_run_dir


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
    # a registered engine (rollout/engines.py), before a model loads; auto is resolved once it has (engine_auto.py)
    kind = None if is_auto(args.engine) else engine_kind(args.engine)
    if rollout_func is not None:
        check_rollout_func(args, rollout_func, tools, environment_factory)
    if kind is not None and kind.check_environment is not None:
        from grpokit.rollout.engines import EngineSite

        # with Ray the workers sample: on CUDA with rollout_worker_gpus, else on the CPU
        workers = ("cuda" if args.rollout_worker_gpus > 0 else "cpu") if args.backend == "ray" else None
        site = EngineSite(procs.enabled, pick_device(args.device).type, workers)
        kind.check_environment(engine_settings(args, args.engine), site)
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
        check_run_dir(specs.part_settings(RunDirSpec, args, config=args.to_dict()), existing=False)
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
