"""Validation: one validator per section (the training sections here, the run-side ones in section_checks.py), then the
cross-section rules (rules.py), in a fixed order.

Each check raises a :class:`ConfigError` whose message names the value, the rule and the fix; no model is
touched. ``validate`` runs them all; the first failing check is the one reported.
"""

from __future__ import annotations

import difflib
from typing import TYPE_CHECKING

from grpokit.config import rules, section_checks
from grpokit.config.sections import CHOICES, ConfigError, check
from grpokit.train.teacher.settings import DistillSettings

if TYPE_CHECKING:
    from typing import Any as GRPOConfig  # the facade (config/facade.py), which imports this module

    from grpokit.config.training import AlgoConfig, GenerationConfig, OptimConfig


def validate(cfg: GRPOConfig, world_size: int = 1) -> None:
    """Every check of the config, sections first where a cross-section rule needs their values sound."""
    rules.imports(cfg)
    _choices(cfg)
    rules.algorithm(cfg, world_size)
    _algo(cfg.algo)
    rules.loss(cfg)
    rules.engine_settings(cfg)  # its own check, before any model loads
    rules.kl_control_and_dynamic_sampling(cfg, world_size)
    _generation(cfg.generation)
    _optim(cfg.optim)
    rules.batch_size(cfg, world_size)
    section_checks.data(cfg.data)
    section_checks.evaluation(cfg.eval)
    section_checks.run(cfg.run)
    section_checks.lora(cfg.lora)
    rules.lora_and_model(cfg)
    section_checks.reward(cfg.reward)
    rules.reward_weights(cfg)
    section_checks.distributed(cfg.distributed)
    rules.distributed(cfg, world_size)
    section_checks.agent(cfg.agent)
    if cfg.agent.tools or cfg.agent.environment_factory:
        check_multi_turn(cfg)


def check_multi_turn(cfg: GRPOConfig) -> None:
    """Refuse the settings multi-turn tool rollouts cannot run with (tools from the config or from
    GRPOTrainer(tools=..., environment_factory=...))."""
    fix = "multi-turn tool rollouts are sampled by the hf engine in the training process"
    check(cfg.generation.engine == "hf", f"tools and environments need generation.engine: hf ({fix}).")
    check(cfg.distributed.backend == "none", f"tools and environments need distributed.backend: none ({fix}).")


def _choices(cfg: GRPOConfig) -> None:
    for name, choices in CHOICES.items():
        value = getattr(cfg, name)
        if value not in choices:
            close = difflib.get_close_matches(str(value), choices, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ConfigError(f"{name}={value!r} is not valid; choose one of {', '.join(choices)}.{hint}")


def _algo(a: AlgoConfig) -> None:
    check(a.epsilon > 0, f"epsilon={a.epsilon} must be > 0 (the clip range, e.g. 0.2).")
    check(a.epsilon_high is None or a.epsilon_high > 0, f"epsilon_high={a.epsilon_high} must be > 0 or null.")
    check(a.beta >= 0, f"beta={a.beta} must be >= 0 (0 disables the KL penalty).")
    check(a.num_iterations >= 1, f"num_iterations={a.num_iterations} must be >= 1.")
    check(0.0 <= a.ref_model_mixup_alpha <= 1.0, f"ref_model_mixup_alpha={a.ref_model_mixup_alpha} must be in [0, 1].")
    check(a.ref_model_sync_steps >= 0, f"ref_model_sync_steps={a.ref_model_sync_steps} must be >= 0 (0 = never).")
    check(a.max_kl is None or a.max_kl > 0, f"max_kl={a.max_kl} must be > 0 or null.")
    check(a.max_kl_patience >= 1, f"max_kl_patience={a.max_kl_patience} must be >= 1.")
    check(
        a.delta is None or a.delta > 1,
        f"delta={a.delta} must be > 1 or null (the cap on the unclipped ratio, above 1 + epsilon_high, e.g. 4).",
    )
    check(
        0 <= a.top_entropy_quantile <= 1,
        f"top_entropy_quantile={a.top_entropy_quantile} must be in [0, 1] (the fraction of tokens trained on, by "
        "entropy; 1 = all, 0.2 in its paper).",
    )
    check(
        a.off_policy_mask_threshold is None or a.off_policy_mask_threshold >= 0,
        f"off_policy_mask_threshold={a.off_policy_mask_threshold} must be >= 0 or null (a mean log-ratio, e.g. 0.5).",
    )
    low, high = a.off_policy_is_min, a.off_policy_is_max
    check(
        (low is None or low >= 0) and (high is None or high > 0) and (low is None or high is None or low < high),
        f"off_policy_is_min={low}, off_policy_is_max={high}: need 0 <= min < max (null: unbounded on that side).",
    )
    check(
        a.multi_objective_aggregation in ("sum_then_normalize", "normalize_then_sum"),
        f"multi_objective_aggregation={a.multi_objective_aggregation!r}: valid choices are sum_then_normalize, "
        "normalize_then_sum.",
    )
    check(
        a.multi_objective_aggregation == "sum_then_normalize" or a.advantage_estimator == "grpo",
        f"multi_objective_aggregation: normalize_then_sum normalises over the batch itself (TRL's GDPO); it "
        f"cannot be combined with advantage_estimator: {a.advantage_estimator}. Set advantage_estimator: grpo.",
    )
    check(
        a.entropy_coef_min <= a.entropy_coef_max and a.entropy_coef_delta >= 0,
        f"entropy_coef_min={a.entropy_coef_min}, entropy_coef_max={a.entropy_coef_max}, entropy_coef_delta="
        f"{a.entropy_coef_delta}: the bounds must be in order (min <= max) and the step >= 0.",
    )
    try:  # the teacher's own settings (train/teacher/settings.py)
        DistillSettings.check(a)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    check(
        not a.distilling or a.importance_sampling_level == "token",
        "a teacher (on-policy distillation) gives each token its own advantage, which importance_sampling_level: "
        "sequence (GSPO: one ratio per sequence) cannot take; set importance_sampling_level: token.",
    )


def _generation(g: GenerationConfig) -> None:
    check(g.max_completion_length >= 1, f"max_completion_length={g.max_completion_length} must be >= 1.")
    check(
        g.temperature > 0,
        f"temperature={g.temperature} must be > 0 (use a small value such as 0.1 for near-greedy sampling).",
    )
    check(0 < g.top_p <= 1, f"top_p={g.top_p} must be in (0, 1].")
    check(g.top_k >= 0, f"top_k={g.top_k} must be >= 0 (0 = off).")
    check(0 <= g.min_p < 1, f"min_p={g.min_p} must be in [0, 1) (0 = off).")
    check(g.repetition_penalty > 0, f"repetition_penalty={g.repetition_penalty} must be > 0 (1 = off).")
    sampling = sampling_options(g)  # generation_kwargs' keys, checked; their values in range too
    for key in ("top_p", "top_k", "min_p", "repetition_penalty"):
        if g.generation_kwargs and key in g.generation_kwargs:
            value = sampling[key]
            ok = {"top_p": 0 < value <= 1, "top_k": value >= 0, "min_p": 0 <= value < 1}.get(key, value > 0)
            check(ok, f"generation_kwargs {key}={value!r} is out of range (as the config key {key}).")


def sampling_options(g: GenerationConfig) -> dict:
    """How completions are sampled besides their length and temperature (``SamplingParams`` fields): top_p, top_k,
    min_p, repetition_penalty, and what ``generation_kwargs`` adds or overrides (TRL's forms,
    ``rollout.generation_options``); a key grpokit cannot honour is a ConfigError naming it."""
    from grpokit.rollout.generation_options import GenerationOptionError, generation_options

    try:
        return generation_options(
            g.temperature,
            g.max_completion_length,
            g.top_p,
            g.top_k,
            g.min_p,
            g.repetition_penalty,
            g.generation_kwargs,
            g.engine,
        )
    except GenerationOptionError as exc:
        raise ConfigError(str(exc)) from None


def _optim(o: OptimConfig) -> None:
    check(o.learning_rate >= 0, f"learning_rate={o.learning_rate} must be >= 0.")
    check(
        o.max_steps >= 1 or o.max_steps == -1,
        f"max_steps={o.max_steps} must be >= 1, or -1 to train num_train_epochs.",
    )
    check(o.num_train_epochs > 0, f"num_train_epochs={o.num_train_epochs} must be > 0.")
    check(o.adam_epsilon > 0, f"adam_epsilon={o.adam_epsilon} must be > 0.")
    check(
        o.per_device_train_batch_size >= 1,
        f"per_device_train_batch_size={o.per_device_train_batch_size} must be >= 1.",
    )
    check(
        o.backward_chunk_rows is None or o.backward_chunk_rows >= 1,
        f"backward_chunk_rows={o.backward_chunk_rows} must be >= 1, or null to choose it from the model's size.",
    )
    check(
        o.gradient_accumulation_steps >= 1,
        f"gradient_accumulation_steps={o.gradient_accumulation_steps} must be >= 1.",
    )
    check(0 <= o.warmup_ratio < 1, f"warmup_ratio={o.warmup_ratio} must be in [0, 1).")
    check(o.warmup_steps >= 0, f"warmup_steps={o.warmup_steps} must be >= 0.")
    check(o.max_grad_norm >= 0, f"max_grad_norm={o.max_grad_norm} must be >= 0 (0 = no clipping).")
    check(o.weight_decay >= 0, f"weight_decay={o.weight_decay} must be >= 0.")
    for beta_name in ("adam_beta1", "adam_beta2"):
        check(
            0 <= getattr(o, beta_name) < 1,
            f"{beta_name}={getattr(o, beta_name)} must be in [0, 1) (AdamW's moving-average rate, e.g. 0.9).",
        )
    check(0 <= o.seed < 2**63, f"seed={o.seed} must be in [0, 2**63).")
    check(o.num_mini_batches >= 1, f"num_mini_batches={o.num_mini_batches} must be >= 1.")
