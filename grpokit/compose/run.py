"""The composition root: :func:`build_run` reads the flat config once and builds every part of a run, in order
(inputs, policy, rollouts, learner, the run around the steps), into a frozen :class:`Run` that the loop
(:class:`grpokit.train.loop.Loop`) runs. Nothing calls back into the builders after this."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from grpokit.algos.algorithms import get_algorithm
from grpokit.compose import inputs as build_inputs
from grpokit.compose import specs
from grpokit.compose.learner import build_learner
from grpokit.compose.policy import build_policy, warn_if_too_big
from grpokit.compose.rollouts import build_rollouts, build_step_sampling
from grpokit.config import GRPOConfig
from grpokit.eval.evaluator import Evaluator
from grpokit.kernels import Kernels
from grpokit.machine.hardware import autocast_dtype
from grpokit.models.loading import ensure_pad_token
from grpokit.train.callbacks import CallbackRunner
from grpokit.train.experience.scoring import Scorer
from grpokit.train.loop_spec import LoopSpec
from grpokit.train.rundir.checkpoint import RunState
from grpokit.train.stopping import StopRules


@dataclass(frozen=True)
class Run:
    """Every part of a built run, and the loop's own spec. ``config`` is the resolved config (max_steps resolved),
    kept for TRL's ``trainer.args`` and the callbacks' events; the loop never reads it."""

    config: GRPOConfig
    spec: LoopSpec
    procs: Any
    # inputs
    train_dataset: Any  # as given (TRL's attribute)
    train_rows: list[dict]
    eval_sets: dict  # {name (None: the one eval_dataset): (PromptSource, rows)}
    rewards: Any  # the RewardRunner
    steps_per_epoch: int
    # the policy
    model: Any
    tokenizer: Any
    device: torch.device
    use_lora: bool
    autocast_dtype: Any
    kernels: Kernels
    train_source: Any  # the training PromptSource
    # rollouts
    rollout_scheduler: Any
    update_inputs_spec: Any
    step_sampling: Any
    # learning
    algorithm: Any
    reference: Any
    optimizer: Any
    scheduler: Any
    learner: Any
    # around the steps
    evaluator: Evaluator
    stop_rules: StopRules
    ties: Any
    callbacks: CallbackRunner
    run_state: RunState
    run_dir_spec: Any

    @property
    def engine(self):
        """The rollout engine sampling in this process (HF or vLLM)."""
        return self.rollout_scheduler.engine


def build_run(
    config: GRPOConfig | None = None,
    *,
    model: Any = None,
    reward_funcs: Any = None,
    train_dataset: Any = None,
    eval_dataset: Any = None,
    tokenizer: Any = None,
    processing_class: Any = None,
    reward_processing_classes: Any = None,
    callbacks: list | None = None,
    optimizers: tuple = (None, None),
    peft_config: Any = None,
    tools: list | None = None,
    environment_factory: Any = None,
    rollout_func: Any = None,
    generate: Any = None,
) -> Run:
    """Check the inputs (everything that can be checked before a model loads), then build the policy, its prompts,
    its rollouts and its learner, and the run around the steps. Arguments as ``GRPOTrainer``'s; ``rollout_func``: TRL's
    (checked here), and ``generate`` the closure it runs through (``fn(prompts) -> RolloutFuncOutput``), or None."""
    config, tokenizer = build_inputs.trainer_arguments(config, peft_config, processing_class, tokenizer)
    procs = build_inputs.run_processes()  # rank and world size under torchrun; one process otherwise
    checked = build_inputs.check_inputs(
        config,
        procs,
        train_dataset,
        eval_dataset,
        reward_funcs,
        reward_processing_classes,
        tools,
        environment_factory,
        rollout_func=rollout_func,
    )
    config = checked.args  # max_steps resolved
    spec = specs.loop_spec(config, procs.world_size)
    parts = dict(
        config=config,
        spec=spec,
        procs=procs,
        train_dataset=train_dataset,
        train_rows=checked.train_rows,
        rewards=checked.rewards,
        steps_per_epoch=checked.steps_per_epoch,
    )
    parts |= _policy(config, parts, model, tokenizer, peft_config, checked.eval_sets)
    parts |= _rollouts(config, parts, checked.tools, None if rollout_func is None else generate)
    parts |= _learning(config, parts, optimizers)
    return Run(**parts, **_around_the_steps(config, parts, callbacks))


def _policy(config: GRPOConfig, parts: dict, model, tokenizer, peft_config, eval_sets: dict) -> dict:
    """The policy on its device with its tokenizer, the prompt sources, and the run's autocast dtype and kernels."""
    spec, procs = parts["spec"], parts["procs"]
    path = model if isinstance(model, str) else spec.model_name_or_path if model is None else None
    if path and procs.is_main:
        warn_if_too_big(config, path)
    model, tokenizer, device, use_lora = build_policy(model, tokenizer, config, peft_config)
    ensure_pad_token(tokenizer)
    train_source, eval_sets = build_inputs.prompt_sources(config, tokenizer, parts["train_rows"], eval_sets)
    torch.manual_seed(spec.seed)
    dtype = autocast_dtype(spec.dtype, device, model, config.mixed_precision)
    return dict(
        model=model,
        tokenizer=tokenizer,
        device=device,
        use_lora=use_lora,
        train_source=train_source,
        eval_sets=eval_sets,
        autocast_dtype=dtype,
        kernels=Kernels.select(device, dtype),  # this run's fast paths, chosen once
        source=path,  # the model's folder or hub id when given by name (vLLM loads its copy from there)
    )


def _rollouts(config: GRPOConfig, parts: dict, tools, generate) -> dict:
    """The rollout scheduler (engine, sampler, source), how the learner takes its rollouts, and each step's
    sampling (one round, or dynamic sampling's), scoring with a :class:`Scorer`."""
    spec, tokenizer = parts["spec"], parts["tokenizer"]
    scheduler, inputs_spec = build_rollouts(
        config,
        model=parts["model"],
        tokenizer=tokenizer,
        prompts=parts["train_source"],
        procs=parts["procs"],
        device=parts["device"],
        autocast_dtype=parts["autocast_dtype"],
        source=parts.pop("source"),
        kernels=parts["kernels"],
        tools=tools,
        rollout_func=generate,
    )
    scorer = Scorer(
        parts["train_rows"],
        parts["train_source"],
        tokenizer,
        parts["rewards"],
        parts["procs"],
        scheduler.tool_rollouts,
        spec.num_generations,
        spec.max_steps,
        spec.prompt_column,
        spec.rewards_on_main,
    )
    step_sampling = build_step_sampling(config, scheduler, scorer, tokenizer.pad_token_id, scorer.state)
    return dict(rollout_scheduler=scheduler, update_inputs_spec=inputs_spec, step_sampling=step_sampling)


def _learning(config: GRPOConfig, parts: dict, optimizers: tuple) -> dict:
    """The algorithm (what the steps ask for advantages), the reference, optimizer, LR schedule and learner."""
    reference, optimizer, lr_scheduler, learner = build_learner(
        parts["model"],
        config,
        procs=parts["procs"],
        device=parts["device"],
        use_lora=parts["use_lora"],
        optimizers=optimizers,
        autocast_dtype=parts["autocast_dtype"],
        kernels=parts["kernels"],
        prompt_tokens=parts["train_source"].longest,
    )
    return dict(
        algorithm=get_algorithm(parts["spec"].algorithm),
        reference=reference,
        optimizer=optimizer,
        scheduler=lr_scheduler,
        learner=learner,
    )


def _around_the_steps(config: GRPOConfig, parts: dict, callbacks: list | None) -> dict:
    """The run around the steps: evaluation, stop rules, the tie watch, callbacks, and what a checkpoint saves."""
    scheduler, procs = parts["rollout_scheduler"], parts["procs"]
    evaluator = Evaluator(
        specs.eval_spec(config),
        engine=scheduler.engine,
        tokenizer=parts["tokenizer"],
        reward_runner=parts["rewards"],
        params=scheduler.sampling,
        tools=scheduler.tool_rollouts,
    )
    stop_rules = StopRules(specs.stop_spec(config))  # non-finite steps, KL over max_kl
    # a warning when every group ties for warn_tied_steps steps (a group-relative advantage learns nothing)
    ties = specs.tie_watch(config, group_relative=not parts["algorithm"].uses_critic)
    runner = CallbackRunner(
        callbacks,
        specs.callback_spec(config),
        args=config,  # passed to the callbacks' events, as transformers passes its TrainingArguments
        max_steps=parts["spec"].max_steps,
        steps_per_epoch=parts["steps_per_epoch"],
        is_main=procs.is_main,
        model=parts["model"],
        processing_class=parts["tokenizer"],
        optimizer=parts["optimizer"],
        lr_scheduler=parts["scheduler"],
    )
    run_state = RunState(
        specs.checkpoint_spec(config),
        model=parts["model"],
        learner=parts["learner"],
        data=parts["train_source"],
        rollouts=scheduler,
        stop_rules=stop_rules,
        is_main=procs.is_main,
        trainer_state=lambda: runner.state,  # log_history and num_input_tokens_seen, as TRL's checkpoints
    )
    return dict(
        evaluator=evaluator,
        stop_rules=stop_rules,
        ties=ties,
        callbacks=runner,
        run_state=run_state,
        run_dir_spec=specs.run_dir_spec(config),
    )
