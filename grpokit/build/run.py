"""The composition root: :func:`build_run` reads the flat config once and builds every part of a run, in order
(inputs, policy, rollouts, learner, the run around the steps), into a frozen :class:`Run` that the loop
(:class:`grpokit.train.loop.Loop`) runs. Nothing calls back into the builders after this."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from grpokit.algos.registry import get_algorithm
from grpokit.build import inputs as build_inputs
from grpokit.build import specs
from grpokit.build.learner import build_learner
from grpokit.build.policy import build_policy, warn_if_too_big
from grpokit.build.rollouts import build_rollouts, build_step_sampling
from grpokit.config import GRPOConfig
from grpokit.eval.evaluator import Evaluator
from grpokit.hardware import autocast_dtype
from grpokit.kernels import Kernels
from grpokit.modeling import ensure_pad_token
from grpokit.train.callbacks import CallbackRunner
from grpokit.train.loop import LoopSpec
from grpokit.train.rundir.checkpoint import RunState
from grpokit.train.sampling.scoring import Scorer
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
    path = model if isinstance(model, str) else spec.model_name_or_path if model is None else None
    if path and procs.is_main:
        warn_if_too_big(config, path)
    model, tokenizer, device, use_lora = build_policy(model, tokenizer, config, peft_config)
    ensure_pad_token(tokenizer)
    train_source, eval_sets = build_inputs.prompt_sources(config, tokenizer, checked.train_rows, checked.eval_sets)
    torch.manual_seed(spec.seed)
    dtype = autocast_dtype(spec.dtype, device, model)
    kernels = Kernels.select(device, dtype)  # this run's fast paths, chosen once
    scheduler, inputs_spec = build_rollouts(
        config,
        model=model,
        tokenizer=tokenizer,
        prompts=train_source,
        procs=procs,
        device=device,
        autocast_dtype=dtype,
        source=path,
        kernels=kernels,
        tools=checked.tools,
        rollout_func=None if rollout_func is None else generate,
    )
    scorer = Scorer(
        checked.train_rows,
        train_source,
        tokenizer,
        checked.rewards,
        procs,
        scheduler.tool_rollouts,
        spec.num_generations,
        spec.max_steps,
        spec.prompt_column,
        spec.rewards_on_main,
    )
    algorithm = get_algorithm(spec.algorithm)  # what the steps ask for advantages (algos/registry.py)
    reference, optimizer, lr_scheduler, learner = build_learner(
        model,
        config,
        procs=procs,
        device=device,
        use_lora=use_lora,
        optimizers=optimizers,
        autocast_dtype=dtype,
        kernels=kernels,
        prompt_tokens=train_source.longest,
    )
    parts = dict(
        config=config,
        spec=spec,
        procs=procs,
        train_dataset=train_dataset,
        train_rows=checked.train_rows,
        eval_sets=eval_sets,
        rewards=checked.rewards,
        steps_per_epoch=checked.steps_per_epoch,
        model=model,
        tokenizer=tokenizer,
        device=device,
        use_lora=use_lora,
        autocast_dtype=dtype,
        kernels=kernels,
        train_source=train_source,
        rollout_scheduler=scheduler,
        update_inputs_spec=inputs_spec,
        step_sampling=build_step_sampling(config, scheduler, scorer, tokenizer.pad_token_id),
        algorithm=algorithm,
        reference=reference,
        optimizer=optimizer,
        scheduler=lr_scheduler,
        learner=learner,
    )
    return Run(**parts, **_around_the_steps(config, parts, callbacks))


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
