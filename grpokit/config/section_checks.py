"""The checks of the run-side sections (data, eval, run, lora, reward, distributed, agent), one function each,
called by :func:`grpokit.config.validation.validate` in its fixed order. Each raises a :class:`ConfigError` naming
the value, the rule and the fix."""

from __future__ import annotations

import difflib
import math
import string
from typing import TYPE_CHECKING

from grpokit.config.sections import REPORT_SINKS, ConfigError, check
from grpokit.data.sources import DATASET_KEYS

if TYPE_CHECKING:
    from grpokit.config.running import AgentConfig, DistributedConfig, EvalConfig, RewardSettings, RunConfig
    from grpokit.config.training import DataConfig
    from grpokit.models.lora_settings import LoraSettings


def data(d: DataConfig) -> None:
    check(
        d.max_prompt_length is None or d.max_prompt_length >= 1,
        f"max_prompt_length={d.max_prompt_length} must be >= 1 or null.",
    )
    for name in ("train_dataset", "eval_dataset"):
        dataset(name, getattr(d, name))
    if d.prompt_template is not None:
        prompt_template(d.prompt_template)
    d.check()  # image_column (data/image_settings.py)


def dataset(name: str, value: object) -> None:
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


def prompt_template(template: str) -> None:
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


def evaluation(e: EvalConfig) -> None:
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


def run(r: RunConfig) -> None:
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
    r.check()  # the store's own settings (store/settings.py)


def lora(lora: LoraSettings) -> None:
    check(lora.r >= 0, f"lora.r={lora.r} must be >= 0 (0 = no LoRA).")
    check(lora.alpha > 0, f"lora.alpha={lora.alpha} must be > 0.")
    check(0 <= lora.dropout < 1, f"lora.dropout={lora.dropout} must be in [0, 1).")


def reward(r: RewardSettings) -> None:
    check(r.reward_workers >= 0, f"reward_workers={r.reward_workers} must be >= 0 (0 = one process per function).")
    for w in r.reward_weights or []:
        check(
            isinstance(w, (int, float)) and not isinstance(w, bool) and math.isfinite(w),
            f"reward_weights contains {w!r}; each weight must be a finite number.",
        )
    check(r.reward_timeout > 0, f"reward_timeout={r.reward_timeout} must be > 0 seconds.")


def distributed(d: DistributedConfig) -> None:
    check(d.num_rollout_workers >= 1, f"num_rollout_workers={d.num_rollout_workers} must be >= 1.")
    check(
        d.rollout_worker_cpus >= 0 and d.rollout_worker_gpus >= 0,
        "rollout_worker_cpus and rollout_worker_gpus must be >= 0.",
    )
    check(
        not d.async_rollouts or d.backend == "ray",
        "async_rollouts needs backend: ray (rollouts are sampled by Ray workers while the learner trains); for a "
        "background thread in this process set max_staleness: 1 instead.",
    )
    check(
        d.max_staleness is None or d.max_staleness >= 0,
        f"max_staleness={d.max_staleness} must be >= 0 (0 = synchronous, K = up to K updates behind) or null.",
    )
    check(d.scoring_threads >= 1, f"scoring_threads={d.scoring_threads} must be >= 1.")
    check(
        not (d.async_rollouts and d.max_staleness == 0),
        "async_rollouts samples one step ahead, max_staleness: 0 never ahead; drop async_rollouts or set "
        "max_staleness >= 1.",
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


def agent(t: AgentConfig) -> None:
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
