"""The rules of where a run runs, which span parts: processes (torchrun), Ray workers, the vllm engine beside the
learner, partial rollouts. Each raises a ConfigError naming the value, the rule and the fix."""

from __future__ import annotations

from typing import TYPE_CHECKING

from grpokit.config.sections import check
from grpokit.train.learning.optimizer_settings import EIGHT_BIT_OPTIMIZERS

if TYPE_CHECKING:
    from typing import Any as GRPOConfig  # the facade (config/facade.py), which imports this module


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
        d.staleness_bound() == 0 or d.backend == "ray" or cfg.generation.engine in ("hf", "auto") or server,
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
        not (cfg.distributed.strategy == "fsdp" and g.vllm_enable_sleep_mode),
        "vllm_enable_sleep_mode: true with strategy: fsdp: each wake reloads the weights, gathered from every rank's "
        "shards, while evaluation samples on rank 0 alone; set vllm_enable_sleep_mode: false (or null).",
    )
    check(
        g.vllm_max_model_length is None or g.vllm_max_model_length > g.max_completion_length,
        f"vllm_max_model_length={g.vllm_max_model_length} leaves no room for a prompt: it must exceed "
        f"max_completion_length={g.max_completion_length} (or be null).",
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
