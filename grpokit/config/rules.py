"""The cross-section rules: settings of different sections that cannot run together.

Each rule raises a :class:`ConfigError` naming both settings and the fix. Algorithm- and loss-specific options are
checked by the algorithm's or the loss's own entry (algos/algorithms.py, algos/loss_registry.py).
"""

from __future__ import annotations

import dataclasses
import difflib
import warnings
from typing import TYPE_CHECKING

import grpokit.config.trl_keys as trl_keys
from grpokit.algos.algorithms import ALGORITHMS
from grpokit.algos.loss_registry import LossSettings, get_loss, loss_types
from grpokit.config.sections import FIELD_SECTION, ConfigError, check
from grpokit.system.extensions import import_modules
from grpokit.train.learning.optimizer_names import EIGHT_BIT_OPTIMIZERS

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
    model.check()  # freeze_vision_tower, freeze_projector (models/vision_settings.py)
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
            trl_keys.lora_head_check(cfg.use_liger_kernel, lora.target_modules)
        except trl_keys.TRLValueError as exc:
            raise ConfigError(str(exc)) from None


def reward_weights(cfg: GRPOConfig) -> None:
    weights = cfg.reward.reward_weights
    if weights is not None and cfg.rewards:
        check(
            len(weights) == len(cfg.rewards),
            f"reward_weights has {len(weights)} values but there are {len(cfg.rewards)} reward functions; give "
            "one weight per function.",
        )


def distributed(cfg: GRPOConfig, world_size: int) -> None:
    d = cfg.distributed
    check(
        d.num_reward_workers == 0 or cfg.reward.reward_workers == 0,
        f"num_reward_workers={d.num_reward_workers} (Ray actors) and reward_workers="
        f"{cfg.reward.reward_workers} (worker processes of the learner) are two places to run the rewards; set "
        "one of them to 0.",
    )
    if cfg.generation.engine == "vllm":
        vllm(cfg)
    if cfg.generation.vllm_partial_rollout_tokens is not None:
        partial_rollouts(cfg, world_size)
    server = cfg.generation.engine == "vllm" and cfg.generation.vllm_mode == "server"
    check(
        d.staleness_bound() == 0 or d.backend == "ray" or cfg.generation.engine == "hf" or server,
        f"max_staleness={d.staleness_bound()} without Ray samples ahead on a background thread with a copy of the "
        f"policy, which the hf engine and a vLLM server support (not generation.engine: {cfg.generation.engine} "
        "in this process); set engine: hf, vllm_mode: server, backend: ray, or max_staleness: 0.",
    )
    check(
        not (server and d.backend == "ray"),
        "vllm_mode: server samples from the server, driven by the learner, so backend: ray would start rollout "
        "workers that never sample; set backend: none (max_staleness >= 1 samples ahead from the server without "
        "Ray), or vllm_mode: colocate for a vLLM in each Ray rollout worker.",
    )
    check(
        d.scoring_threads == 1
        or (cfg.reward.reward_isolation is False and cfg.reward.reward_workers == 0 and d.num_reward_workers == 0),
        f"scoring_threads={d.scoring_threads} scores several batches at once, which reward worker processes cannot "
        "take; set reward_isolation: false (rewards on threads), reward_workers: 0 and num_reward_workers: 0, or "
        "scoring_threads: 1.",
    )
    check(
        d.staleness_bound() == 0 or not (cfg.agent.tools or cfg.agent.environment_factory),
        "max_staleness >= 1 samples ahead, which multi-turn tool rollouts do not; set max_staleness: 0.",
    )
    check(
        cfg.generation.engine != "transformers" or d.backend != "ray",
        "generation.engine: transformers (transformers' generate, for generation_kwargs grpokit's sampler cannot "
        "honour) runs in the learner's processes, not in Ray rollout workers; set backend: none (torchrun is fine), "
        "or remove those generation_kwargs.",
    )
    check(
        d.strategy != "fsdp" or cfg.lora.r == 0,
        "strategy: fsdp shards full fine-tuning; LoRA trains small adapters (lora.r > 0), which "
        "need no sharding: set strategy: ddp, or lora.r: 0 to fine-tune every weight with FSDP.",
    )
    check(
        d.strategy != "fsdp"
        or (cfg.optim.optimizer not in EIGHT_BIT_OPTIMIZERS and cfg.model.ref_model_dtype == "auto"),
        "strategy: fsdp shards the weights and AdamW's state already; the 8-bit optimizer and ref_model_dtype: "
        "bfloat16 are for one process's memory: set optimizer: adamw_torch_fused and ref_model_dtype: auto, or "
        "strategy: ddp.",
    )


def vllm(cfg: GRPOConfig) -> None:
    """Settings engine: vllm cannot run with (the package and device checks are the trainer's, at start)."""
    g = cfg.generation
    fix = "or set generation.engine: hf"
    check(
        cfg.model.device in ("auto", "cpu") or cfg.model.device.startswith("cuda"),
        f"generation.engine: vllm runs on CUDA or, with vLLM's CPU build, the CPU, but model.device="
        f"{cfg.model.device!r}; set device: auto, cuda or cpu, {fix}.",
    )
    check(
        not cfg.model.load_in_4bit,
        f"generation.engine: vllm cannot load the learner's 4-bit (QLoRA) weights; set load_in_4bit: false, {fix}.",
    )
    check(g.temperature <= 2.0, f"temperature={g.temperature}: vLLM samples at temperatures up to 2; lower it, {fix}.")
    check(
        g.vllm_tensor_parallel_size == 1,
        f"vllm_tensor_parallel_size={g.vllm_tensor_parallel_size}: grpokit runs one vLLM engine per torchrun rank "
        "(tensor-parallel groups are not implemented: never run on vLLM's CPU build or on GPUs); set "
        "vllm_tensor_parallel_size: 1.",
    )
    check(
        not (cfg.distributed.strategy == "fsdp" and g.vllm_enable_sleep_mode),
        "vllm_enable_sleep_mode: true with strategy: fsdp: each wake reloads the weights, gathered from every rank's "
        "shards, while evaluation samples on rank 0 alone; set vllm_enable_sleep_mode: false (or null).",
    )
    check(
        0 < g.vllm_gpu_memory_utilization <= 1,
        f"vllm_gpu_memory_utilization={g.vllm_gpu_memory_utilization} must be in (0, 1] (a fraction of the GPU's "
        "memory, e.g. 0.3).",
    )
    check(
        g.vllm_max_model_length is None or g.vllm_max_model_length > g.max_completion_length,
        f"vllm_max_model_length={g.vllm_max_model_length} leaves no room for a prompt: it must exceed "
        f"max_completion_length={g.max_completion_length} (or be null).",
    )
    check(
        g.vllm_server_timeout > 0,
        f"vllm_server_timeout={g.vllm_server_timeout} must be > 0 (seconds the server may take to answer, e.g. 240).",
    )
    check(
        g.vllm_max_logprob_gap is None or g.vllm_max_logprob_gap > 0,
        f"vllm_max_logprob_gap={g.vllm_max_logprob_gap} must be > 0 (nats per sampled token, e.g. 1e-3), or null.",
    )
    check(
        g.vllm_server_base_url is None or g.vllm_server_base_url.startswith(("http://", "https://")),
        f"vllm_server_base_url={g.vllm_server_base_url!r} must start with http:// or https://, e.g. "
        "http://127.0.0.1:8000.",
    )
    check(
        g.vllm_kv_cache_gib is None or g.vllm_kv_cache_gib > 0,
        f"vllm_kv_cache_gib={g.vllm_kv_cache_gib} must be > 0 (GiB of KV cache, e.g. 1), or null.",
    )
    check(
        g.vllm_importance_sampling_cap >= 1,
        f"vllm_importance_sampling_cap={g.vllm_importance_sampling_cap} must be >= 1 (weights are truncated at it; "
        "1 never up-weights a token).",
    )
    modes = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")
    check(
        g.vllm_importance_sampling_mode in modes,
        f"vllm_importance_sampling_mode={g.vllm_importance_sampling_mode!r}: valid choices are {', '.join(modes)}.",
    )
    low = g.vllm_importance_sampling_clip_min
    check(
        low is None or 0 <= low <= g.vllm_importance_sampling_cap,
        f"vllm_importance_sampling_clip_min={low} must be in [0, vllm_importance_sampling_cap="
        f"{g.vllm_importance_sampling_cap}] (or null for no lower bound).",
    )
    check(
        cfg.algo.loss_type != "vespo" or g.vllm_importance_sampling_mode.startswith("token"),
        f"loss_type: vespo weighs each token by the sampler itself and needs vllm_importance_sampling_mode "
        f"token_truncate or token_mask, not {g.vllm_importance_sampling_mode} (as TRL).",
    )


def partial_rollouts(cfg: GRPOConfig, world_size: int) -> None:
    """``vllm_partial_rollout_tokens`` S: vLLM Ray rollout workers (rollout/partial.py) or a vLLM server
    (train/experience/server_partial.py) sampling ahead, for one learner process."""
    g, d, S = cfg.generation, cfg.distributed, cfg.generation.vllm_partial_rollout_tokens
    where = "continues completions on newer weights in vLLM Ray rollout workers or a vLLM server"
    check(
        g.engine == "vllm" and (g.vllm_mode == "server" or (d.backend == "ray" and g.vllm_mode == "colocate")),
        f"vllm_partial_rollout_tokens={S} {where}, not with generation.engine: {g.engine}, distributed.backend: "
        f"{d.backend}, vllm_mode: {g.vllm_mode}; set engine: vllm with backend: ray and vllm_mode: colocate, or "
        "engine: vllm with vllm_mode: server, or vllm_partial_rollout_tokens: null.",
    )
    check(
        d.staleness_bound() >= 1,
        f"vllm_partial_rollout_tokens={S} switches a batch to the next policy version, but max_staleness: 0 samples "
        "each batch with the newest weights (nothing to switch to); set max_staleness >= 1, or "
        "vllm_partial_rollout_tokens: null.",
    )
    check(
        0 < S < g.max_completion_length,
        f"vllm_partial_rollout_tokens={S} must be in [1, max_completion_length={g.max_completion_length}) (the tokens "
        "sampled by the admitted version before the switch), or null.",
    )
    check(
        world_size == 1,
        f"vllm_partial_rollout_tokens={S} runs with one learner process; under torchrun ({world_size} processes) "
        "it has not been tested; run one process (Ray rollout workers still share the sampling), or "
        "vllm_partial_rollout_tokens: null.",
    )
    check(
        g.vllm_partial_rollout_timeout > 0,
        f"vllm_partial_rollout_timeout={g.vllm_partial_rollout_timeout} must be > 0 (seconds, e.g. 1800).",
    )
