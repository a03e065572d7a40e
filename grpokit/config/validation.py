"""Validation: each part's own settings check (the ``check()`` of the settings classes the sections are assembled
from), then the rules that span parts (rules.py), in a fixed order.

Each check raises a :class:`ConfigError` whose message names the value, the rule and the fix; no model is
touched. ``validate`` runs them all; the first failing check is the one reported.
"""

from __future__ import annotations

import difflib
from typing import TYPE_CHECKING

from grpokit.config import placement, rules
from grpokit.config.sections import CHOICES, SECTIONS, ConfigError, check, part_checks

if TYPE_CHECKING:
    from typing import Any as GRPOConfig  # the facade (config/facade.py), which imports this module

    from grpokit.config.training import GenerationConfig


def validate(cfg: GRPOConfig, world_size: int = 1) -> None:
    """Every check of the config: each part's own settings check (``check()`` of the settings classes a section is
    assembled from), then the rules that span parts, in a fixed order."""
    rules.imports(cfg)
    _choices(cfg)
    part_checks({name: getattr(cfg, name) for name in SECTIONS})  # each part's own settings check
    rules.algorithm(cfg, world_size)
    rules.loss(cfg)
    rules.engine_settings(cfg)  # its own check, before any model loads
    rules.kl_control_and_dynamic_sampling(cfg, world_size)
    _generation(cfg.generation)
    _distillation(cfg.algo)
    rules.batch_size(cfg, world_size)
    rules.lora_and_model(cfg)
    rules.reward_weights(cfg)
    placement.distributed(cfg, world_size)
    if cfg.agent.tools or cfg.agent.environment_factory:
        check_multi_turn(cfg)


def check_multi_turn(cfg: GRPOConfig) -> None:
    """Refuse the settings multi-turn tool rollouts cannot run with (tools from the config or from
    GRPOTrainer(tools=..., environment_factory=...))."""
    fix = "multi-turn tool rollouts are sampled by the hf or transformers engine in the training process"
    check(
        cfg.generation.engine in ("hf", "transformers", "auto"),
        f"tools and environments need generation.engine: hf or transformers ({fix}).",
    )
    check(cfg.distributed.backend == "none", f"tools and environments need distributed.backend: none ({fix}).")


def _choices(cfg: GRPOConfig) -> None:
    for name, choices in CHOICES.items():
        value = getattr(cfg, name)
        if value not in choices:
            close = difflib.get_close_matches(str(value), choices, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ConfigError(f"{name}={value!r} is not valid; choose one of {', '.join(choices)}.{hint}")


def _distillation(a) -> None:
    check(
        not a.distilling or a.importance_sampling_level == "token",
        "a teacher (on-policy distillation) gives each token its own advantage, which importance_sampling_level: "
        "sequence (GSPO: one ratio per sequence) cannot take; set importance_sampling_level: token.",
    )


def _generation(g: GenerationConfig) -> None:
    """generation_kwargs' keys against the engine, and their values in range (the keys' own ranges: the sampling
    settings' check)."""
    sampling = sampling_options(g)
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
