"""The composition root's reading of the config: :func:`part_settings` fills a part's settings class from it, and
three functions derive the values that come from several parts (the learner's, how rollouts become its inputs, and
the loop's world-size-dependent ones).

The flat :class:`~grpokit.config.GRPOConfig` is for users, YAML and TRL scripts. Inside grpokit only the
config package and the composition root (this module and the rest of :mod:`grpokit.compose`, which builds the parts)
read it: every other part takes the spec built here (or the one config section it needs) and nothing else, so
what a part depends on is written in its spec's fields. ``tests/unit/test_config_reads.py`` keeps it so.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from grpokit.train.learning.learner import LearnerSpec, UpdateInputsSpec
from grpokit.train.learning.terms_settings import LossTermsSettings

if TYPE_CHECKING:
    from grpokit.config import GRPOConfig
    from grpokit.data.prompt_builder import PromptBuilder
    from grpokit.rollout.types import SamplingParams
    from grpokit.train.loop_spec import LoopSpec
    from grpokit.train.ties import TieWatch


def learner_spec(args: GRPOConfig, backward_chunk_rows: int | None = None) -> LearnerSpec:
    """The policy update's settings (``train.learning.learner.Learner``); ``backward_chunk_rows``: the root's
    choice for the model (``memory.update_chunk_rows``; default the config's)."""
    adaptive = args.kl_controller == "adaptive"
    return LearnerSpec(
        loss=args.loss_spec(),
        loss_type=args.loss_type,
        temperature=args.temperature,
        per_device_train_batch_size=args.per_device_train_batch_size,
        num_mini_batches=args.num_mini_batches,
        num_iterations=args.num_iterations,
        max_grad_norm=args.max_grad_norm,
        beta=args.beta,
        kl_in_reward=args.kl_in_reward,
        target_kl=args.target_kl if adaptive else None,
        kl_horizon=args.kl_horizon,
        reference_casts=not args.ref_model_sync_steps,
        reference_in_bf16=args.ref_model_dtype == "bfloat16",
        top_entropy_quantile=args.top_entropy_quantile,
        backward_chunk_rows=backward_chunk_rows or args.backward_chunk_rows,
        terms=part_settings(LossTermsSettings, args),
        distill_loss=args.distill_loss,
        distill_coef=args.distill_coef,
    )


def optimizer_steps(args: GRPOConfig) -> int:
    """Optimizer steps in the run, which the learning-rate schedules span: max_steps x num_iterations x
    num_mini_batches (derived from the optim and algo sections)."""
    return args.max_steps * args.optimizer_steps_per_step()


def part_settings(cls: type, args: GRPOConfig, **derived):
    """The one way a part's settings reach it: ``cls`` (its settings class, or a spec whose fields are config keys)
    with the run's values, each field the config key of its name, but those given in ``derived`` (values the root
    works out from several parts, or that are no key, such as the resolved config); adding a key to a part's
    settings needs no line here. A field with a default that is no config key keeps its default; one without is an
    AttributeError naming it."""
    values = {}
    for f in dataclasses.fields(cls):
        if f.name in derived:
            values[f.name] = derived[f.name]
        elif f.init and (_is_key(f.name) or _no_default(f)):
            values[f.name] = getattr(args, f.name)
    return cls(**values)


def _is_key(name: str) -> bool:
    from grpokit.config.sections import FIELD_SECTION
    from grpokit.config.trl_keys import TRL_DEFAULTS

    return name in FIELD_SECTION or name in TRL_DEFAULTS


def _no_default(f: dataclasses.Field) -> bool:
    return f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING


def update_inputs_spec(args: GRPOConfig, off_policy: bool, separate_sampler: bool) -> UpdateInputsSpec:
    """How rollouts become the learner's inputs; ``off_policy``: the run's rollout source samples ahead
    (max_staleness >= 1), corrected by ``off_policy_correction`` (``algos.offpolicy.CORRECTIONS``);
    ``separate_sampler``: its engine samples from its own copy of the weights (vLLM)."""
    from grpokit.algos.offpolicy import get_correction

    correction = get_correction(args.off_policy_correction)
    return UpdateInputsSpec(
        mask_truncated_completions=args.mask_truncated_completions,
        ratio_to_sampler=off_policy and correction.clip_to_behaviour,
        importance_weights=(separate_sampler and args.vllm_importance_sampling_correction)
        or (off_policy and correction.weighs_behaviour),
    )


def sampling_params(args: GRPOConfig) -> SamplingParams:
    """How training samples its completions: temperature, top-p/k, min-p, repetition penalty and TRL's
    generation_kwargs (checked by the config)."""
    from grpokit.rollout.types import SamplingParams

    return SamplingParams(args.max_completion_length, args.temperature, **args.sampling_options())


def tie_watch(args: GRPOConfig, group_relative: bool) -> TieWatch:
    """The watch behind the warning when every group ties for ``warn_tied_steps`` steps in a row."""
    from grpokit.train.ties import TieWatch

    return TieWatch(args.warn_tied_steps, args.num_generations, group_relative)


def prompt_builder(args: GRPOConfig) -> PromptBuilder:
    """How the data section builds each row's prompt (prompt_template, system_prompt, use_chat_template)."""
    from grpokit.data.prompt_builder import PromptBuilder

    return PromptBuilder(args.prompt_column, args.prompt_template, args.system_prompt, args.use_chat_template)


def loop_spec(args: GRPOConfig, world_size: int) -> LoopSpec:
    """The training loop's own settings (:class:`grpokit.train.loop.Loop`); ``args`` with max_steps
    resolved."""
    from grpokit.models.hub import HubSpec
    from grpokit.train.loop_spec import LoopSpec

    return LoopSpec(
        model_name_or_path=args.model_name_or_path,
        dtype=args.dtype,
        seed=args.seed,
        algorithm=args.algorithm,
        algo=gdpo_algo(args.algo),
        num_generations=args.num_generations,
        max_steps=args.max_steps,
        completions_per_step=args.completions_per_step(world_size),
        prompt_column=args.prompt_column,
        rewards_on_main=args.num_reward_workers > 0,
        ref_model_sync_steps=args.ref_model_sync_steps,
        ref_model_mixup_alpha=args.ref_model_mixup_alpha,
        logging_steps=args.logging_steps,
        save_at_end=args.save_strategy != "no",
        merge_on_save=args.merge_on_save,
        eval_dataset=args.eval_dataset,
        token_values=args.run.kept_token_values(),
        log_completions=bool(args.log_completions),
        log_multimodal=bool(args.log_multimodal),
        hub=HubSpec(
            model_id=args.hub_model_id,
            token=args.hub_token,
            private=bool(args.hub_private_repo),
            revision=args.hub_revision,
        ),
    )


def gdpo_algo(algo):
    """The algorithm section the loop reads; under normalize_then_sum (TRL's GDPO) the group advantage of the
    summed normalised rewards is scaled by the batch's std: each group's mean is already 0, so that is TRL's
    (x - mean(x)) / (std(x) + 1e-4) over the batch (``algos.multi_objective``)."""
    if algo.multi_objective_aggregation == "normalize_then_sum":
        return dataclasses.replace(algo, scale_rewards="batch")
    return dataclasses.replace(algo)
