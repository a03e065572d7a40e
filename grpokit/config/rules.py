"""The cross-section rules: settings of different sections that cannot run together.

Each rule raises a :class:`ConfigError` naming both settings and the fix. Algorithm- and loss-specific options are
checked by the algorithm's or the loss's own entry (algos/algorithms.py, algos/loss_registry.py).
"""

from __future__ import annotations

import dataclasses
import difflib
import warnings
from typing import TYPE_CHECKING

import grpokit.config.trl_forms as trl_forms
from grpokit.algos.algorithms import ALGORITHMS
from grpokit.algos.loss_registry import LossSettings, get_loss, loss_types
from grpokit.config.sections import FIELD_SECTION, ConfigError, check
from grpokit.system.extensions import import_modules

if TYPE_CHECKING:
    from typing import Any as GRPOConfig  # the facade (config/facade.py), which imports this module


def imports(cfg: GRPOConfig) -> None:
    """The modules of ``algo.imports``, imported first: what they register is then known to the checks below."""
    import_modules(cfg.algo.imports)


def algorithm(cfg: GRPOConfig, world_size: int) -> None:
    """``algorithm`` by name (``algos/algorithms.py``) and the options of the chosen one (its ``check``)."""
    a = cfg.algo
    if a.algorithm not in ALGORITHMS:
        close = difflib.get_close_matches(str(a.algorithm), ALGORITHMS, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ConfigError(f"algorithm={a.algorithm!r} is not valid; choose one of {', '.join(ALGORITHMS)}.{hint}")
    try:
        ALGORITHMS[a.algorithm].check(a, world_size)  # the algorithm reads its own section
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def loss(cfg: GRPOConfig) -> None:
    """``loss_type`` by name (``algos/loss_registry.py``: the built-ins and those ``algo.imports`` registered), the
    settings it cannot run with (its ``check``: a ConfigError) and its advice on likely mistakes (a warning)."""
    a = cfg.algo
    names = loss_types()
    if a.loss_type not in names:
        close = difflib.get_close_matches(str(a.loss_type), names, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ConfigError(
            f"loss_type={a.loss_type!r} is not valid; choose one of {', '.join(names)} (or a loss registered by a "
            f"module of algo.imports).{hint}"
        )
    try:
        advice = get_loss(a.loss_type).check(loss_settings(cfg))
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    for line in advice:
        warnings.warn(f"grpokit: {line}", UserWarning, stacklevel=2)


def loss_params(cfg: GRPOConfig):
    """The loss's own parameters (the dataclass it registered) from the config: each from ``algo.loss_params``, else
    from the config key of that name (sapo_temperature_pos ...), else its default; None for a loss without any."""
    kind = get_loss(cfg.algo.loss_type)
    given = dict(cfg.algo.loss_params)
    if kind.params is None:
        if given:
            raise ConfigError(f"loss_params {sorted(given)}: loss_type {kind.name} has no parameters; remove them.")
        return None
    names = {f.name for f in dataclasses.fields(kind.params)}
    unknown = sorted(set(given) - names)
    if unknown:
        raise ConfigError(
            f"loss_params {unknown}: loss_type {kind.name} has no such parameter; its parameters: {sorted(names)}."
        )
    values = {name: getattr(cfg.algo, name) for name in names if hasattr(cfg.algo, name)} | given
    return kind.make_params(values)


def engine_settings(cfg: GRPOConfig, engine: str | None = None):
    """The settings object of the engine ``engine`` (default: ``generation.engine``) as its registry entry declares
    it (``EngineEntry.settings``): each field from the config key of that name, else from ``engine_params``, else its
    default; then its own ``check()``. None for an engine without settings (``engine_params`` must then be empty)."""
    from grpokit.rollout.engines import ENGINES

    name = cfg.generation.engine if engine is None else engine
    entry = ENGINES.get(name)
    given = dict(cfg.generation.engine_params)
    if entry is None or entry.settings is None:
        if given:
            raise ConfigError(f"engine_params {sorted(given)}: engine {name} has no settings; remove them.")
        return None
    names = {f.name for f in dataclasses.fields(entry.settings)}
    unknown = sorted(set(given) - names)
    if unknown:
        raise ConfigError(f"engine_params {unknown}: engine {name} has no such setting; its settings: {sorted(names)}.")
    values = {key: getattr(cfg, key) for key in names if key in FIELD_SECTION} | given
    settings = entry.settings(**values)
    if hasattr(settings, "check"):
        try:
            settings.check()
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    return settings


def loss_settings(cfg: GRPOConfig) -> LossSettings:
    """What the loss's check sees (never the whole config)."""
    a = cfg.algo
    return LossSettings(a.loss_type, a.epsilon, a.epsilon_high, a.importance_sampling_level, loss_params(cfg))


def kl_control_and_dynamic_sampling(cfg: GRPOConfig, world_size: int) -> None:
    a = cfg.algo
    check(a.kl_horizon > 0, f"kl_horizon={a.kl_horizon} must be > 0 (e.g. 10000).")
    if a.kl_controller == "adaptive":
        check(
            a.target_kl is not None and a.target_kl > 0,
            f"kl_controller: adaptive needs target_kl > 0 (the KL to steer towards, e.g. 0.1), got {a.target_kl}.",
        )
        check(
            a.beta > 0,
            "kl_controller: adaptive multiplies beta each step, so beta=0 would stay 0; start it above 0 "
            "(e.g. beta: 0.04).",
        )
        n = cfg.completions_per_step(world_size)
        check(
            a.kl_horizon > 0.2 * n,
            f"kl_horizon={a.kl_horizon} must be above 0.2 x completions per step ({n}) = {0.2 * n:g}, or one step "
            "could take beta to 0 or below; raise it (e.g. 10000).",
        )
    else:
        check(
            a.target_kl is None,
            f"target_kl={a.target_kl} is used by the adaptive KL controller only; set kl_controller: adaptive, or "
            "remove target_kl for a fixed beta.",
        )
    check(a.max_sampling_rounds >= 1, f"max_sampling_rounds={a.max_sampling_rounds} must be >= 1.")
    if not a.dynamic_sampling:
        return
    check(
        a.num_generations >= 2,
        f"dynamic_sampling keeps the groups whose rewards differ, and a group of num_generations="
        f"{a.num_generations} never differs; set num_generations >= 2, or turn dynamic_sampling off.",
    )
    check(
        cfg.distributed.staleness_bound() == 0,
        "dynamic_sampling samples more prompts within a step, which async_rollouts / max_staleness >= 1 (steps "
        "sampled ahead) cannot; set async_rollouts: false and max_staleness: 0 (Ray rollout workers still sample "
        "each round), or turn dynamic_sampling off.",
    )
    check(
        world_size == 1,
        f"dynamic_sampling runs in one process; under torchrun ({world_size} processes) the informative groups "
        "would land unevenly on the ranks. Run one process (backend: ray spreads the sampling over workers), or "
        "turn dynamic_sampling off.",
    )


def batch_size(cfg: GRPOConfig, world_size: int) -> None:
    o, a = cfg.optim, cfg.algo
    n = cfg.completions_per_step(world_size)
    mini = f" x num_mini_batches ({o.num_mini_batches})" if o.num_mini_batches > 1 else ""
    check(
        n % a.num_generations == 0,
        f"completions per step = per_device_train_batch_size ({o.per_device_train_batch_size}) x "
        f"gradient_accumulation_steps ({o.gradient_accumulation_steps}){mini} x processes ({world_size}) = {n} "
        f"is not divisible by num_generations ({a.num_generations}); make it a multiple of {a.num_generations}.",
    )
    rows = o.backward_chunk_rows
    check(
        rows is None or rows >= o.per_device_train_batch_size or a.top_entropy_quantile >= 1.0,
        f"backward_chunk_rows={rows} splits a micro-batch, but top_entropy_quantile={a.top_entropy_quantile} takes "
        "its quantile over the whole micro-batch's entropies; remove backward_chunk_rows, or make "
        "per_device_train_batch_size smaller instead.",
    )


def lora_and_model(cfg: GRPOConfig) -> None:
    a, lora, model = cfg.algo, cfg.lora, cfg.model
    check(
        lora.r == 0 or a.ref_model_sync_steps == 0,
        f"ref_model_sync_steps={a.ref_model_sync_steps} cannot be used with LoRA: the reference is the base model "
        "under the adapters, which never changes; set ref_model_sync_steps: 0.",
    )
    check(
        not model.load_in_4bit or lora.r > 0,
        "load_in_4bit: true trains LoRA adapters on frozen 4-bit weights (QLoRA); set lora.r > 0 (e.g. lora.r: 16).",
    )
    if model.ref_model_dtype == "bfloat16":
        check(
            lora.r == 0,
            "ref_model_dtype: bfloat16 stores the reference copy in bf16, but with LoRA there is no copy (the "
            "reference is the base under the adapters); set ref_model_dtype: auto.",
        )
        check(
            a.ref_model_sync_steps == 0,
            "ref_model_dtype: bfloat16 cannot be used with ref_model_sync_steps: the resync's small mix-ups "
            "would be lost to bf16 rounding; set ref_model_dtype: auto or ref_model_sync_steps: 0.",
        )
    if lora.r > 0:
        try:
            trl_forms.lora_head_check(cfg.use_liger_kernel, lora.target_modules)
        except trl_forms.TRLValueError as exc:
            raise ConfigError(str(exc)) from None


def reward_weights(cfg: GRPOConfig) -> None:
    weights = cfg.reward.reward_weights
    if weights is not None and cfg.rewards:
        check(
            len(weights) == len(cfg.rewards),
            f"reward_weights has {len(weights)} values but there are {len(cfg.rewards)} reward functions; give "
            "one weight per function.",
        )
