"""Building the rollouts: the engine, the sampler and the source (:mod:`grpokit.train.experience`), and how each step
samples."""

from __future__ import annotations

from grpokit.compose import specs
from grpokit.compose.vision_paths import check_image_paths
from grpokit.config import ConfigError, GRPOConfig
from grpokit.config.rules import engine_settings


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
    """The run's rollout scheduler: the engine named by ``generation.engine`` (``rollout.engines``; ``rollout_func``
    when one is given), the sampler (Ray workers, tool rollouts, raw prompts for an engine that takes them, a seed per
    group, a copy of the policy or a vLLM server driven from a background thread, or the engine's one stream) and the
    source (up to ``max_staleness`` steps ahead, else synchronous) from ``train.experience.sources``. ``source``: the
    model's folder or hub id when it was given by name (vLLM loads its copy from there), else None; ``tools``: the
    run's ToolSpec, or None; ``rollout_func``: the trainer's ``_generate`` when GRPOTrainer was given a rollout_func
    (it calls the function and checks its output), else None.
    Returns (scheduler, UpdateInputsSpec: how the learner takes the source's rollouts)."""
    from grpokit.train.experience.rollout_scheduler import RolloutScheduler
    from grpokit.train.experience.sampler_entry import SamplerInputs
    from grpokit.train.experience.sources import pick_sampler
    from grpokit.train.experience.tool_rollouts import ToolRollouts

    name = args.engine if rollout_func is None else "rollout_func"
    check_image_paths(args, name, prompts, procs, tools, rollout_func)  # no path drops a prompt's images
    kind = engine_kind(name)
    parts = engine_parts(args, model, tokenizer, device, source, rollout_func, autocast_dtype, kernels)
    settings = engine_settings(args, name)
    partial = kind.partial(settings)  # a vLLM server's partial rollouts: (S tokens, timeout) or None
    # vLLM with Ray: the workers hold the engines; the learner keeps grpokit's (versions, evaluation)
    in_workers = args.backend == "ray" and kind.in_ray_workers
    in_ray = (settings, partial) if in_workers else ()  # what the Ray workers' engines are built with
    engine = engine_kind("hf").build(parts, None) if in_workers else kind.build(parts, settings)
    sampling = specs.sampling_params(args)
    # multi-turn tool rollouts on the hf or transformers engine (the config refuses tools with vLLM and Ray)
    tool_rollouts = None
    if tools is not None:
        if kind.tool_engine is None or in_workers:
            raise ConfigError(f"tools and environments need generation.engine: hf or transformers, not {name}.")
        tool_rollouts = ToolRollouts(
            tools, engine, tokenizer, args.prompt_column, args.chat_template_kwargs, tool_engine=kind.tool_engine
        )
    ahead = args.distributed.staleness_bound()  # K: steps sampled ahead
    entry = pick_sampler(_situation(args, procs, engine, kind.serves(settings), tool_rollouts is not None, ahead))
    sampler = entry.cls.from_inputs(
        SamplerInputs(
            engine=engine,
            prompts=prompts,
            procs=procs,
            model=model,
            num_generations=args.num_generations,
            params=sampling,
            seed=args.seed,
            prompt_column=args.prompt_column,
            tool_rollouts=tool_rollouts,
            partial_rollouts=partial,
            workers_continue_partial=in_workers and partial is not None,
            # built only when the sampler asks (Ray: rank 0 starts the workers)
            remote=lambda: _start_ray(args, parts, *in_ray) if procs.is_main else None,
            own_engine=lambda: _own_engine(kind, parts, procs, rollout_func),
            own_model=lambda: _own_model(model),
        )
    )
    rollout_source = _rollout_source(args, sampler, procs, ahead)
    scheduler = RolloutScheduler(
        source=rollout_source,
        engine=engine,
        prompts=prompts,
        procs=procs,
        prompts_per_step=args.prompts_per_step(procs.world_size),
        sampling=sampling,
        tool_rollouts=tool_rollouts,
        sync_check=engine if kind.checks_sync and not in_workers else None,
    )
    inputs = specs.update_inputs_spec(args, rollout_source.off_policy, kind.separate_weights)
    return scheduler, inputs


def _situation(args: GRPOConfig, procs, engine, server: bool, tools: bool, ahead: int):
    """What the sampler is picked for (``train.experience.sources.Situation``)."""
    from grpokit.train.experience.sampler_entry import Situation

    return Situation(
        ray=args.backend == "ray",
        tool_rollouts=tools,
        raw_prompts=engine.takes_raw_prompts,
        seeded=args.seed_per_group or procs.enabled,  # rollouts must not depend on the split over processes
        ahead=ahead > 0,
        server=server,
    )


def _rollout_source(args: GRPOConfig, sampler, procs, ahead: int):
    """The source over ``sampler``: up to ``ahead`` steps sampled ahead (scored on the producers' side too, unless
    the scoring's gathers need every rank), or synchronous when ``ahead`` is 0."""
    from grpokit.train.experience.sources import pick_source

    source = pick_source(ahead > 0)
    if not source.off_policy:
        return source(sampler)
    return source(
        sampler,
        last_step=args.max_steps,
        max_staleness=ahead,
        score_ahead=not procs.enabled,
        scorers=args.scoring_threads,
    )


def engine_parts(args: GRPOConfig, model, tokenizer, device, source, rollout_func, autocast_dtype, kernels):
    """What any engine samples with (``rollout.engines.EngineParts``)."""
    from grpokit.models.loading import eos_token_ids
    from grpokit.rollout.engines import EngineParts

    return EngineParts(
        model,
        eos_token_ids(model, tokenizer),
        tokenizer.pad_token_id,
        device,
        args.seed,
        args.trust_remote_code,
        source=source,
        max_length=None if args.max_prompt_length is None else args.max_prompt_length + args.max_completion_length,
        generate=rollout_func,
        autocast_dtype=autocast_dtype,
        kernels=kernels,
    )


def engine_kind(name: str):
    """The registered engine called ``name`` (``rollout/engines.py``); a ConfigError naming the ones
    ``generation.engine`` may name otherwise."""
    import difflib

    from grpokit.rollout.engines import ENGINES
    from grpokit.rollout.sampling_settings import AUTO_ENGINE

    if name in ENGINES:
        return ENGINES[name]
    names = [key for key, entry in ENGINES.items() if not entry.internal] + [AUTO_ENGINE]
    close = difflib.get_close_matches(str(name), names, n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    raise ConfigError(f"engine={name!r} is not valid; choose one of {', '.join(names)}.{hint}")


def _own_engine(kind, parts, procs, rollout_func):
    """The hf engine on a copy of the policy, for sampling ahead on a background thread (one process)."""
    import copy
    from dataclasses import replace

    if procs.enabled or rollout_func is not None:
        raise ConfigError(
            "max_staleness >= 1 without Ray samples on a background thread of one process, with grpokit's own "
            "sampler; run one process without rollout_func, set distributed.backend: ray, or max_staleness: 0."
        )
    return kind.build(replace(parts, model=copy.deepcopy(parts.model)), None)


def _own_model(model):
    """A copy of the policy that a vLLM server's batches sampled ahead are pushed from (one process)."""
    import copy

    return copy.deepcopy(model)


def _start_ray(args: GRPOConfig, parts, vllm_settings=None, partial: tuple[int, float] | None = None):
    """Connect to Ray (``distributed.address``) and start the rollout workers (``vllm_settings``: each with a vLLM;
    ``partial``: its partial rollouts' (S tokens, timeout), or None)."""
    from grpokit.distributed.placement import learner_gpu_ids
    from grpokit.distributed.ray_rollout import RayRolloutEngine, connect
    from grpokit.distributed.ray_vllm import worker_vllm_options
    from grpokit.rollout.vllm.settings import vllm_spec

    learner_gpus = learner_gpu_ids(parts.device)  # never given to a rollout or reward actor
    connect(args.address, args.ray_num_cpus, learner_gpus)
    return RayRolloutEngine(
        parts.model,
        parts.eos_token_ids,
        parts.pad_token_id,
        args.num_rollout_workers,
        args.rollout_worker_cpus,
        args.rollout_worker_gpus,
        parts.autocast_dtype,
        learner_gpus,
        None
        if vllm_settings is None
        else worker_vllm_options(
            vllm_spec(vllm_settings, parts.source, parts.trust_remote_code, parts.max_length),
            args.seed,
            args.rollout_worker_cpus,
        ),
        partial=partial,
    )


def build_step_sampling(args: GRPOConfig, scheduler, score, pad_token_id: int, reward_state=None):
    """How each step samples (:mod:`grpokit.train.experience.rounds`): one round, or with ``dynamic_sampling`` rounds
    until the batch holds informative groups; ``score``: the scoring of a round; ``reward_state(step)``: the rewards'
    trainer_state, taken when a batch sampled ahead is drawn."""
    from grpokit.train.experience.rounds import DynamicRounds, SingleRound

    if not args.dynamic_sampling:
        return SingleRound(scheduler, score, reward_state)
    return DynamicRounds(
        scheduler,
        score,
        target_groups=args.prompts_per_step(),
        max_rounds=args.max_sampling_rounds,
        num_generations=args.num_generations,
        num_mini_batches=args.num_mini_batches,
        pad_token_id=pad_token_id,
    )
