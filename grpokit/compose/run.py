"""The composition root: :func:`build_run` reads the flat config once and builds every part of a run, in order
(inputs, policy, rollouts, learner, the run around the steps), into a frozen :class:`Run` that the loop
(:class:`grpokit.train.loop.Loop`) runs. Nothing calls back into the builders after this:
what reads a dataset given later (``trainer.evaluate(eval_dataset=...)``) is a part of the Run, its DataReader."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from grpokit.algos.algorithms import get_algorithm
from grpokit.algos.settings import KLControlSettings
from grpokit.compose import arguments, datasets, specs
from grpokit.compose import inputs as build_inputs
from grpokit.compose.engine_auto import resolve_run_engine
from grpokit.compose.learner import build_learner
from grpokit.compose.policy import build_policy, warn_if_too_big
from grpokit.compose.rewards import eval_reward_runner
from grpokit.compose.rollouts import build_rollouts, build_step_sampling, engine_kind
from grpokit.compose.teacher import build_distiller, fold_teacher_model, teacher_ahead, teacher_alone
from grpokit.config import GRPOConfig
from grpokit.data.settings import PromptSettings
from grpokit.eval.evaluator import Evaluator
from grpokit.eval.settings import EvalSettings
from grpokit.kernels import Kernels
from grpokit.kernels.cpu_precision import run_compute
from grpokit.models.loading import ensure_pad_token
from grpokit.rollout.engine_choice import is_auto
from grpokit.train.callbacks import CallbackRunner
from grpokit.train.experience.scoring import Scorer
from grpokit.train.learning.reference_settings import ReferenceSettings
from grpokit.train.learning.update_settings import UpdateSettings
from grpokit.train.loop_settings import StopSettings
from grpokit.train.loop_spec import LoopSpec
from grpokit.train.rundir.checkpoint import RunState
from grpokit.train.rundir.folder import RunDirSpec
from grpokit.train.rundir.settings import CheckpointSettings
from grpokit.train.stopping import StopRules
from grpokit.train.tracking_settings import TrackingSettings

if TYPE_CHECKING:
    from grpokit.algos.algorithms import Algorithm
    from grpokit.data.prompts import PromptSource
    from grpokit.data.readers import DataReader
    from grpokit.rewards.runner import RewardRunner
    from grpokit.system.processes import SingleProcess
    from grpokit.train.experience.rollout_scheduler import RolloutScheduler
    from grpokit.train.experience.rounds import SingleRound
    from grpokit.train.learning.learner import Learner, UpdateInputsSpec
    from grpokit.train.learning.reference import Reference
    from grpokit.train.teacher.distiller import Distiller
    from grpokit.train.ties import TieWatch


@dataclass(frozen=True)
class Policy:
    """The build's policy stage: the model on its device with its tokenizer, the prompt sources, and the run's
    autocast dtype and kernels; ``source``: the model's folder or hub id when given by name (vLLM loads its copy)."""

    model: torch.nn.Module
    tokenizer: Any  # a transformers tokenizer, or a module's own (data/char_tokenizer.py)
    device: torch.device
    use_lora: bool
    train_source: PromptSource
    eval_sets: dict  # {name (None: the one eval_dataset): (PromptSource, rows)}
    autocast_dtype: torch.dtype | None
    kernels: Kernels
    source: str | None
    sampling_dtype: torch.dtype | None  # a CPU may sample faster in another dtype than it learns in
    sampling_kernels: Kernels
    precision_notes: tuple[str, ...]  # how the compute dtypes were chosen: the top of config.yaml


@dataclass(frozen=True)
class Rollouts:
    """The build's rollout stage: the scheduler (engine, sampler, source), how the learner takes its rollouts, and
    each step's sampling (one round, or dynamic sampling's)."""

    rollout_scheduler: RolloutScheduler
    update_inputs_spec: UpdateInputsSpec
    step_sampling: SingleRound


@dataclass(frozen=True)
class Learning:
    """The build's learning stage: the algorithm, the reference, optimizer, LR schedule and learner."""

    algorithm: Algorithm
    reference: Reference | None
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    learner: Learner
    distiller: Distiller | None  # on-policy distillation's teacher (compose/teacher.py); None without one


@dataclass(frozen=True)
class AroundTheSteps:
    """The build's last stage: evaluation, stop rules, the tie watch, callbacks, and what a checkpoint saves."""

    evaluator: Evaluator
    stop_rules: StopRules
    ties: TieWatch | None
    callbacks: CallbackRunner
    run_state: RunState
    run_dir_spec: RunDirSpec
    data_reader: DataReader


@dataclass(frozen=True)
class Run:
    """Every part of a built run, and the loop's own spec. ``config`` is the resolved config (max_steps resolved),
    kept for TRL's ``trainer.args`` and the callbacks' events; the loop never reads it."""

    config: GRPOConfig
    spec: LoopSpec
    procs: SingleProcess  # or a torchrun rank's DistContext
    # inputs
    train_dataset: Any  # as given (TRL's attribute)
    train_rows: list[dict]
    eval_sets: dict  # {name (None: the one eval_dataset): (PromptSource, rows)}
    rewards: RewardRunner
    steps_per_epoch: int
    # the policy
    model: torch.nn.Module
    tokenizer: Any  # a transformers tokenizer, or a module's own (data/char_tokenizer.py)
    device: torch.device
    use_lora: bool
    autocast_dtype: torch.dtype | None
    kernels: Kernels
    train_source: PromptSource
    # rollouts
    rollout_scheduler: RolloutScheduler
    update_inputs_spec: UpdateInputsSpec
    step_sampling: SingleRound
    # learning
    algorithm: Algorithm
    reference: Reference | None
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    learner: Learner
    distiller: Distiller | None
    # around the steps
    evaluator: Evaluator
    stop_rules: StopRules
    ties: TieWatch | None
    callbacks: CallbackRunner
    run_state: RunState
    run_dir_spec: RunDirSpec
    data_reader: DataReader  # reads a dataset given after the build (evaluate(eval_dataset=...), data loaders)

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
    teacher_model: Any = None,
) -> Run:
    """Check the inputs (everything that can be checked before a model loads), then build the policy, its prompts,
    its rollouts and its learner, and the run around the steps. Arguments as ``GRPOTrainer``'s; ``rollout_func``: TRL's
    (checked here), and ``generate`` the closure it runs through (``fn(prompts) -> RolloutFuncOutput``), or None."""
    config, tokenizer = arguments.trainer_arguments(config, peft_config, processing_class, tokenizer)
    config = fold_teacher_model(config, teacher_model)  # a loaded teacher: its name in the config, the module below
    procs = arguments.run_processes()  # rank and world size under torchrun; one process otherwise
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
    policy, config = _policy(config, spec, procs, checked, model, tokenizer, peft_config)  # engine: auto resolved
    rollouts = _rollouts(config, spec, procs, checked, policy, None if rollout_func is None else generate)
    learning = _learning(config, spec, procs, policy, optimizers, teacher_model)
    teacher_ahead(rollouts.rollout_scheduler, learning.distiller)
    return Run(
        config=config,
        spec=spec,
        procs=procs,
        train_dataset=train_dataset,
        train_rows=checked.train_rows,
        rewards=checked.rewards,
        steps_per_epoch=checked.steps_per_epoch,
        **_fields(policy, exclude={"source", "sampling_dtype", "sampling_kernels", "precision_notes"}),
        **_fields(rollouts),
        **_fields(learning),
        **_fields(_around_the_steps(config, spec, procs, checked, policy, rollouts, learning, callbacks)),
    )


def _fields(stage, exclude: set = frozenset()) -> dict:
    """A stage's fields by name, as the Run takes them (shallow: the parts themselves, not copies)."""
    return {f.name: getattr(stage, f.name) for f in dataclasses.fields(stage) if f.name not in exclude}


def _policy(config: GRPOConfig, spec: LoopSpec, procs, checked, model, tokenizer, peft_config):
    """(the policy on its device with its tokenizer, the prompt sources, and the run's autocast dtype and kernels;
    the config with ``generation.engine: auto`` resolved to an engine, :mod:`grpokit.compose.engine_auto`)."""
    path = model if isinstance(model, str) else spec.model_name_or_path if model is None else None
    if path and procs.is_main:
        warn_if_too_big(config, path)
    model, tokenizer, device, use_lora = build_policy(model, tokenizer, config, peft_config)
    ensure_pad_token(tokenizer)
    train_source, eval_sets = datasets.prompt_sources(config, tokenizer, checked.train_rows, checked.eval_sets)
    torch.manual_seed(spec.seed)
    engine_note = ()
    if is_auto(config.engine):  # resolved on the loaded policy, before run_compute reads the engine's facts
        compute = _compute(config, spec, procs, device, model, own_sampler=True)
        config, choice = resolve_run_engine(
            config,
            procs,
            model=model,
            tokenizer=tokenizer,
            device=device,
            source=path,
            compute=compute,
            prompts=train_source,
            tools=checked.tools,
        )
        engine_note = (choice.note(),)
    compute = _compute(config, spec, procs, device, model, own_sampler=engine_kind(config.engine).own_sampler)
    dtype = compute.learning
    kernels = Kernels.select(device, dtype)  # this run's fast paths, chosen once
    return Policy(
        model=model,
        tokenizer=tokenizer,
        device=device,
        use_lora=use_lora,
        train_source=train_source,
        eval_sets=eval_sets,
        autocast_dtype=dtype,
        kernels=kernels,
        source=path,
        sampling_dtype=compute.sampling,
        sampling_kernels=kernels if compute.sampling == dtype else Kernels.select(device, compute.sampling),
        precision_notes=(*compute.notes, *engine_note),
    ), config


def _compute(config: GRPOConfig, spec: LoopSpec, procs, device, model, own_sampler: bool):
    """The run's compute dtypes (:func:`grpokit.kernels.cpu_precision.run_compute`; the probe's rates are cached)."""
    return run_compute(
        spec.dtype,
        device,
        model,
        config.mixed_precision,
        sample_rows=config.completions_per_step(),
        world_size=procs.world_size,
        own_sampler=own_sampler,
    )


def _rollouts(config: GRPOConfig, spec: LoopSpec, procs, checked, policy: Policy, generate) -> Rollouts:
    """The rollout scheduler (engine, sampler, source), how the learner takes its rollouts, and each step's
    sampling (one round, or dynamic sampling's), scoring with a :class:`Scorer`."""
    scheduler, inputs_spec = build_rollouts(
        config,
        model=policy.model,
        tokenizer=policy.tokenizer,
        prompts=policy.train_source,
        procs=procs,
        device=policy.device,
        autocast_dtype=policy.sampling_dtype,
        source=policy.source,
        kernels=policy.sampling_kernels,
        tools=checked.tools,
        rollout_func=generate,
    )
    scorer = Scorer(
        checked.train_rows,
        policy.train_source,
        policy.tokenizer,
        checked.rewards,
        procs,
        scheduler.tool_rollouts,
        spec.num_generations,
        spec.max_steps,
        spec.prompt_column,
        spec.rewards_on_main,
    )
    step_sampling = build_step_sampling(config, scheduler, scorer, policy.tokenizer.pad_token_id, scorer.state)
    return Rollouts(rollout_scheduler=scheduler, update_inputs_spec=inputs_spec, step_sampling=step_sampling)


def _learning(config: GRPOConfig, spec: LoopSpec, procs, policy: Policy, optimizers: tuple, teacher) -> Learning:
    """The algorithm (what the steps ask for advantages), the reference, optimizer, LR schedule and learner."""
    reference, optimizer, lr_scheduler, learner = build_learner(
        policy.model,
        config,
        procs=procs,
        device=policy.device,
        use_lora=policy.use_lora,
        optimizers=optimizers,
        autocast_dtype=policy.autocast_dtype,
        kernels=policy.kernels,
        prompt_tokens=policy.train_source.longest,
    )
    return Learning(
        algorithm=get_algorithm(spec.algorithm),
        reference=reference,
        optimizer=optimizer,
        scheduler=lr_scheduler,
        learner=learner,
        distiller=build_distiller(config, policy.model, policy.tokenizer, policy.device, procs, teacher),
    )


def _around_the_steps(
    config: GRPOConfig,
    spec: LoopSpec,
    procs,
    checked,
    policy: Policy,
    rollouts: Rollouts,
    learning: Learning,
    callbacks,
) -> AroundTheSteps:
    """The run around the steps: evaluation, stop rules, the tie watch, callbacks, and what a checkpoint saves."""
    scheduler = rollouts.rollout_scheduler
    evaluator = Evaluator(
        specs.part_settings(EvalSettings, config),
        specs.part_settings(PromptSettings, config),
        engine=scheduler.engine,
        tokenizer=policy.tokenizer,
        reward_runner=eval_reward_runner(config, checked.rewards),
        params=scheduler.sampling,
        tools=scheduler.tool_rollouts,
    )
    # non-finite steps, KL over max_kl
    stop_rules = StopRules(specs.part_settings(StopSettings, config), specs.part_settings(KLControlSettings, config))
    # a warning when every group ties for warn_tied_steps steps (a group-relative advantage learns nothing); not with
    # the teacher alone (`rewards: []`): there every group ties by design and the teacher's term teaches
    watched = not learning.algorithm.uses_critic and not teacher_alone(checked.rewards)
    ties = specs.tie_watch(config, group_relative=watched)
    runner = CallbackRunner(
        callbacks,
        tracking=specs.part_settings(TrackingSettings, config),
        evaluation=specs.part_settings(EvalSettings, config),
        checkpoints=specs.part_settings(CheckpointSettings, config),
        batch=specs.part_settings(UpdateSettings, config),
        args=config,  # passed to the callbacks' events, as transformers passes its TrainingArguments
        max_steps=spec.max_steps,
        steps_per_epoch=checked.steps_per_epoch,
        is_main=procs.is_main,
        model=policy.model,
        processing_class=policy.tokenizer,
        optimizer=learning.optimizer,
        lr_scheduler=learning.scheduler,
    )
    run_state = RunState(
        specs.part_settings(CheckpointSettings, config),
        specs.part_settings(ReferenceSettings, config),
        model=policy.model,
        learner=learning.learner,
        data=policy.train_source,
        rollouts=scheduler,
        stop_rules=stop_rules,
        is_main=procs.is_main,
        trainer_state=lambda: runner.state,  # log_history and num_input_tokens_seen, as TRL's checkpoints
    )
    return AroundTheSteps(
        evaluator=evaluator,
        stop_rules=stop_rules,
        ties=ties,
        callbacks=runner,
        run_state=run_state,
        run_dir_spec=specs.part_settings(RunDirSpec, config, config=config.to_dict(), notes=policy.precision_notes),
        data_reader=datasets.data_reader(config, policy.tokenizer, checked.rewards),
    )
