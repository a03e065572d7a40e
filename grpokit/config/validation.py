"""Validation: one validator per section, then the cross-section rules (rules.py), in a fixed order.

Each check raises a :class:`ConfigError` whose message names the value, the rule and the fix; no model is
touched. ``validate`` runs them all; the first failing check is the one reported.
"""

from __future__ import annotations

import difflib
import math
import string
from typing import TYPE_CHECKING

from grpokit.config import rules
from grpokit.config.schema import CHOICES, DATASET_KEYS, REPORT_SINKS, ConfigError, check

if TYPE_CHECKING:
    from typing import Any as GRPOConfig  # the facade (config/facade.py), which imports this module

    from grpokit.config.running import AgentConfig, DistributedConfig, EvalConfig, LoraConfig, RewardSettings, RunConfig
    from grpokit.config.training import AlgoConfig, DataConfig, GenerationConfig, OptimConfig


def validate(cfg: GRPOConfig, world_size: int = 1) -> None:
    """Every check of the config, sections first where a cross-section rule needs their values sound."""
    rules.imports(cfg)
    _choices(cfg)
    rules.algorithm(cfg, world_size)
    _algo(cfg.algo)
    rules.loss(cfg)
    rules.kl_control_and_dynamic_sampling(cfg, world_size)
    _generation(cfg.generation)
    _optim(cfg.optim)
    rules.batch_size(cfg, world_size)
    _data(cfg.data)
    _eval(cfg.eval)
    _run(cfg.run)
    _lora(cfg.lora)
    rules.lora_and_model(cfg)
    _reward(cfg.reward)
    rules.reward_weights(cfg)
    _distributed(cfg.distributed)
    rules.distributed(cfg)
    _agent(cfg.agent)
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


def _data(d: DataConfig) -> None:
    check(
        d.max_prompt_length is None or d.max_prompt_length >= 1,
        f"max_prompt_length={d.max_prompt_length} must be >= 1 or null.",
    )
    for name in ("train_dataset", "eval_dataset"):
        _dataset(name, getattr(d, name))
    if d.prompt_template is not None:
        _prompt_template(d.prompt_template)


def _dataset(name: str, value: object) -> None:
    """A dataset mapping has datasets.load_dataset's keys and a path; hf:PATH[:NAME[:SPLIT]] has a path."""
    example = "e.g. {path: openai/gsm8k, name: main, split: train}"
    if isinstance(value, str) and value.startswith("hf:"):
        check(
            bool(value[3:].split(":", 1)[0]),
            f"{name}={value!r} names no dataset; write hf:PATH[:NAME[:SPLIT]], e.g. hf:openai/gsm8k:main:train.",
        )
        return
    if not isinstance(value, dict):
        return
    for key in value:
        if key not in DATASET_KEYS:
            close = difflib.get_close_matches(str(key), DATASET_KEYS, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ConfigError(
                f"{name} has an unknown key {key!r}; a dataset mapping takes {', '.join(DATASET_KEYS)} (the "
                f"arguments of datasets.load_dataset), {example}.{hint}"
            )
    check(
        isinstance(value.get("path"), str) and bool(value["path"]),
        f"{name} needs a path: a hub id, a local folder, or json / csv / parquet with data_files; {example}.",
    )
    for key in ("name", "split", "data_dir", "revision"):
        check(
            value.get(key) is None or isinstance(value[key], str),
            f"{name}.{key}={value.get(key)!r} must be a string, {example}.",
        )
    files = value.get("data_files")
    check(
        files is None or isinstance(files, (str, list, dict)),
        f"{name}.data_files={files!r} must be a path, a list of paths or a mapping of split -> paths.",
    )


def _prompt_template(template: str) -> None:
    try:
        fields = [field for _, field, _, _ in string.Formatter().parse(template) if field is not None]
    except ValueError as exc:
        raise ConfigError(
            f"prompt_template={template!r} is not a valid format string ({exc}); name columns in braces, e.g. "
            "{question}, and write literal braces as {{ and }}."
        ) from None
    check(
        bool(fields) and all(field and not field[0].isdigit() for field in fields),
        f"prompt_template={template!r} names no column; put the column in braces, e.g. "
        '"{question}\\nAnswer after ####." (literal braces are written {{ and }}).',
    )


def _eval(e: EvalConfig) -> None:
    check(e.eval_steps >= 0, f"eval_steps={e.eval_steps} must be >= 0 (0 = off).")
    check(e.num_generations_eval >= 1, f"num_generations_eval={e.num_generations_eval} must be >= 1.")
    check(
        e.eval_temperature is None or e.eval_temperature > 0,
        f"eval_temperature={e.eval_temperature} must be > 0 or null (= temperature).",
    )
    check(
        e.max_eval_prompts is None or e.max_eval_prompts >= 1,
        f"max_eval_prompts={e.max_eval_prompts} must be >= 1 or null (= all).",
    )
    for k in e.pass_at_k:
        check(
            isinstance(k, int) and 1 <= k <= e.num_generations_eval,
            f"pass_at_k contains {k!r}: each k must be an integer in [1, "
            f"num_generations_eval={e.num_generations_eval}].",
        )


def _run(r: RunConfig) -> None:
    check(r.save_steps >= 0, f"save_steps={r.save_steps} must be >= 0 (0 = only at the end).")
    check(
        r.save_total_limit is None or r.save_total_limit >= 1,
        f"save_total_limit={r.save_total_limit} must be >= 1 or null.",
    )
    check(r.max_nonfinite_steps >= 1, f"max_nonfinite_steps={r.max_nonfinite_steps} must be >= 1.")
    check(r.warn_tied_steps >= 0, f"warn_tied_steps={r.warn_tied_steps} must be >= 0 (0 = never warn).")
    check(r.logging_steps >= 1, f"logging_steps={r.logging_steps} must be >= 1.")
    check(
        r.num_completions_to_print is None or r.num_completions_to_print >= 1,
        f"num_completions_to_print={r.num_completions_to_print} must be >= 1 or null (= all).",
    )
    for sink in r.report_to:
        check(sink in REPORT_SINKS, f"report_to contains {sink!r}; valid sinks are {', '.join(REPORT_SINKS)}.")


def _lora(lora: LoraConfig) -> None:
    check(lora.r >= 0, f"lora.r={lora.r} must be >= 0 (0 = no LoRA).")
    check(lora.alpha > 0, f"lora.alpha={lora.alpha} must be > 0.")
    check(0 <= lora.dropout < 1, f"lora.dropout={lora.dropout} must be in [0, 1).")


def _reward(r: RewardSettings) -> None:
    check(r.reward_workers >= 0, f"reward_workers={r.reward_workers} must be >= 0 (0 = one process per function).")
    for w in r.reward_weights or []:
        check(
            isinstance(w, (int, float)) and not isinstance(w, bool) and math.isfinite(w),
            f"reward_weights contains {w!r}; each weight must be a finite number.",
        )
    check(r.reward_timeout > 0, f"reward_timeout={r.reward_timeout} must be > 0 seconds.")


def _distributed(d: DistributedConfig) -> None:
    check(d.num_rollout_workers >= 1, f"num_rollout_workers={d.num_rollout_workers} must be >= 1.")
    check(
        d.rollout_worker_cpus >= 0 and d.rollout_worker_gpus >= 0,
        "rollout_worker_cpus and rollout_worker_gpus must be >= 0.",
    )
    check(
        not d.async_rollouts or d.backend == "ray",
        "async_rollouts needs backend: ray (rollouts are sampled by Ray workers while the learner trains).",
    )
    check(
        d.num_reward_workers >= 0,
        f"num_reward_workers={d.num_reward_workers} must be >= 0 (0 = rewards in the learner process).",
    )
    check(d.reward_worker_cpus >= 0, f"reward_worker_cpus={d.reward_worker_cpus} must be >= 0.")
    check(
        d.num_reward_workers == 0 or d.backend == "ray",
        f"num_reward_workers={d.num_reward_workers} needs backend: ray (Ray reward actors); "
        "without Ray use reward.reward_workers for worker processes of the learner.",
    )
    if d.backend == "ray" and d.address is None and d.ray_num_cpus is not None:
        wanted = d.num_rollout_workers * d.rollout_worker_cpus + d.num_reward_workers * d.reward_worker_cpus
        check(
            wanted <= d.ray_num_cpus,
            f"the Ray actors reserve {wanted:g} CPUs (num_rollout_workers x rollout_worker_cpus + "
            f"num_reward_workers x reward_worker_cpus) but the local cluster has ray_num_cpus={d.ray_num_cpus}, so "
            "some would never start; "
            "lower the workers or their CPUs, or raise ray_num_cpus.",
        )


def _agent(t: AgentConfig) -> None:
    for spec in t.tools:
        check(
            isinstance(spec, str) and ":" in spec,
            f"tools contains {spec!r}; each entry is 'module:function' or 'path/to/file.py:function' (pass "
            "functions themselves as GRPOTrainer(tools=[...])).",
        )
    check(
        t.environment_factory is None or ":" in t.environment_factory,
        f"environment_factory={t.environment_factory!r}: give 'module:Class' or 'path/to/file.py:Class'.",
    )
    check(
        t.max_tool_calling_iterations is None or t.max_tool_calling_iterations >= 0,
        f"max_tool_calling_iterations={t.max_tool_calling_iterations} must be >= 0 or null (no limit).",
    )
    check(t.tool_timeout > 0, f"tool_timeout={t.tool_timeout} must be > 0 seconds.")
    check(t.tool_workers >= 1, f"tool_workers={t.tool_workers} must be >= 1.")
