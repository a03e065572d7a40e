"""TRL's GRPOConfig keys in grpokit's GRPOConfig: a TRL script's config runs unchanged.

``TRL_DEFAULTS`` (config/trl_defaults.py) is every field of TRL 1.16's ``GRPOConfig`` with its default.
:func:`from_trl` turns the TRL forms of a config into grpokit's fields:

* keys both libraries have pass through (their TRL-only value forms translated: ``report_to="none"``,
  ``eval_steps=None``, ``logging_steps=0.1`` as a fraction of max_steps, ``scale_rewards=True`` ...);
* TRL-only keys grpokit acts on map onto grpokit's fields (``bf16`` -> ``dtype``, ``use_cpu`` ->
  ``device``, ``disable_tqdm`` -> ``progress_bar``, ``use_vllm`` -> ``engine`` ...);
* every other TRL key is accepted and returned as *unused*, for one warning naming them, unless it
  is left at TRL's default, where it asks for nothing grpokit does not do.

docs/from_trl.md is the table of these names.
"""

from __future__ import annotations

import math
import os
from typing import Any

from grpokit.config.trl_defaults import TRL_DEFAULTS
from grpokit.config.trl_forms import TRLValueError, accelerator_settings, report_sinks
from grpokit.rollout.generation_options import _same, generate_only_keys
from grpokit.train.learning.optimizer_settings import OPTIMIZERS

# Keys with a grpokit default that TRL writes as None: None keeps grpokit's default.
NONE_KEEPS_DEFAULT = (
    "output_dir",
    "min_p",
    "num_generations_eval",
    "vllm_importance_sampling_cap",
    "vllm_max_model_length",
)

# Unused keys named even at TRL's default, because grpokit does something else there.
ALWAYS_NAMED: tuple[str, ...] = ()

# TRL keys grpokit acts on without a field of that name (handled in from_trl).
TRANSLATED = (
    "bf16",
    "fp16",
    "activation_checkpointing",
    "use_cpu",
    "disable_tqdm",
    "shuffle_dataset",
    "use_vllm",
    "sync_ref_model",
    "model_init_kwargs",
    "run_name",
    "vllm_importance_sampling_clip_max",
    "resume_from_checkpoint",
    "optim",
    "logging_strategy",
    "steps_per_generation",
    "generation_batch_size",
    "do_train",
    "do_eval",
    "do_predict",
    "local_rank",
    "disable_dropout",  # the policy's (and its reference copy's) Dropout modules get p = 0, as TRL does
    "chat_template_kwargs",  # passed to apply_chat_template wherever a prompt or a tool round is rendered
    # read by trainer.push_to_hub() (the repo, its visibility, the token and branch)
    "hub_model_id",
    "hub_token",
    "hub_private_repo",
    "hub_revision",
    "use_liger_kernel",  # asks for a fused LM-head loss: grpokit's own fused head; a LoRA lm_head is refused (as TRL)
)


def from_trl(
    given: dict[str, Any], context: dict[str, Any], grpokit_fields: set[str], trl_keywords: frozenset = frozenset()
) -> tuple[dict, dict, dict]:
    """Split the flat ``given`` values into (grpokit field values, TRL-only keys given, the unused ones).

    ``context``: every value in force (defaults, an earlier config, ``given``), for the keys whose meaning
    depends on another (eval_steps on logging_steps, ratios on max_steps). ``trl_keywords``: the keys given the
    TRL way (GRPOConfig's keyword arguments in Python, by TRL's names); with ``num_iterations`` among them, the
    step counts given count optimizer steps, as in TRL (:func:`_generation_batch`). Empty for a YAML file, a
    command line, a run's saved config.yaml, ``replace()`` and attributes: their step counts are grpokit's.
    """
    values = {k: v for k, v in given.items() if k in grpokit_fields}
    trl = {k: v for k, v in given.items() if k not in grpokit_fields}
    unused: dict[str, Any] = {}
    explicit = set(values)
    _check_types(trl)

    def put(key: str, value: Any, source: str) -> None:
        if key in explicit and key in values and values[key] != value:
            raise TRLValueError(
                f"{source} sets {key}={value!r}, but {key}={values[key]!r} is given too; keep one of them."
            )
        values[key] = value

    _shared_forms(values, context, put, unused)
    _trl_only_keys(trl, values, context, put, unused)
    _generation_batch(trl, values, context, put, trl_keywords)
    _unused_keys(trl, put, unused)
    return values, trl, unused


def _check_types(trl: dict[str, Any]) -> None:
    """The TRL-only values whose type is wrong: chat_template_kwargs not a dict, a switch not a boolean."""
    if trl.get("chat_template_kwargs") is not None and not isinstance(trl["chat_template_kwargs"], dict):
        raise TRLValueError(
            f"chat_template_kwargs={trl['chat_template_kwargs']!r} has the wrong type: expected a dict of "
            "apply_chat_template keywords, e.g. {'enable_thinking': False}."
        )
    for key, value in trl.items():  # TRL's switches are booleans (None: unset)
        switch = isinstance(TRL_DEFAULTS.get(key), bool) or key in ("bf16", "tf32", "disable_tqdm")
        if switch and value is not None and not isinstance(value, bool):
            raise TRLValueError(f"{key}={value!r} has the wrong type: expected true or false.")


def _shared_forms(values: dict, context: dict, put, unused: dict) -> None:
    """TRL's forms of the keys both libraries have: None for a default, report_to's strings, scale_rewards=True,
    fractions of max_steps, eval_steps after eval_strategy."""
    for key in NONE_KEEPS_DEFAULT:
        if key in values and values[key] is None:
            del values[key]
    report_to = values.get("report_to")
    listed = isinstance(report_to, (list, tuple)) and all(isinstance(x, str) for x in report_to)
    if isinstance(report_to, str) or listed:
        values["report_to"], extra = report_sinks(report_to)
        if extra:
            unused["report_to"] = extra
    if isinstance(values.get("scale_rewards"), bool):  # TRL's older form
        values["scale_rewards"] = "group" if values["scale_rewards"] else "none"
    if values.get("lr_scheduler_type") == "constant_with_warmup":  # grpokit's constant warms up first
        values["lr_scheduler_type"] = "constant"
    warmup = values.get("warmup_steps")
    if isinstance(warmup, float) and 0 < warmup < 1:  # TRL: a fraction of the run
        del values["warmup_steps"]
        put("warmup_ratio", warmup, f"warmup_steps={warmup}")
    max_steps = context.get("max_steps")
    for key in ("logging_steps", "save_steps", "eval_steps"):
        if isinstance(values.get(key), float) and 0 < values[key] < 1:  # TRL: a fraction of max_steps
            if not isinstance(max_steps, int) or max_steps < 1:
                raise TRLValueError(
                    f"{key}={values[key]} is a fraction of max_steps, which is not set; give {key} in steps."
                )
            values[key] = max(1, math.ceil(values[key] * max_steps))
    if "eval_steps" in values and values["eval_steps"] is None:
        del values["eval_steps"]
    samples = values.get("num_generations_eval")  # TRL's num_generations_eval=1 must not trip the default pass@8
    default_ks = "pass_at_k" not in values and context.get("pass_at_k", [1, 8]) == [1, 8]
    if default_ks and isinstance(samples, int) and not isinstance(samples, bool) and 1 <= samples < 8:
        values["pass_at_k"] = sorted({1, samples})
    if values.get("eval_strategy") == "no":
        values["eval_steps"] = 0  # TRL ignores eval_steps then
    elif values.get("eval_strategy") == "steps" and "eval_steps" not in values:
        values["eval_steps"] = context.get("logging_steps") or 1  # TRL: eval_steps defaults to logging_steps


def _trl_only_keys(trl: dict, values: dict, context: dict, put, unused: dict) -> None:
    """The TRL-only keys grpokit acts on, each onto its grpokit field (bf16 -> mixed_precision, use_vllm -> engine
    ...)."""
    # bf16 / fp16: TRL's autocast over float32 weights (machine/precision.py); model_init_kwargs' dtype: the weights'
    if trl.get("bf16") and trl.get("fp16"):
        raise TRLValueError("bf16=True and fp16=True: choose one.")
    if trl.get("bf16") or trl.get("fp16"):
        put("mixed_precision", "bf16" if trl.get("bf16") else "fp16", "bf16=True" if trl.get("bf16") else "fp16=True")
    elif trl.get("bf16") is False:
        put("mixed_precision", "no", "bf16=False")
    init = trl.get("model_init_kwargs")
    if isinstance(init, dict):  # from_pretrained's arguments: grpokit has dtype and trust_remote_code
        rest = dict(init)
        dtype = rest.pop("dtype", rest.pop("torch_dtype", None))
        if dtype is not None:
            put("dtype", str(dtype).removeprefix("torch."), "model_init_kwargs")
        if "trust_remote_code" in rest:
            put("trust_remote_code", bool(rest.pop("trust_remote_code")), "model_init_kwargs")
        if rest:
            unused["model_init_kwargs"] = rest
    if trl.get("activation_checkpointing") is not None:  # TRL's newer name
        put("gradient_checkpointing", bool(trl["activation_checkpointing"]), "activation_checkpointing")
    if trl.get("use_cpu"):
        put("device", "cpu", "use_cpu=True")
    if trl.get("disable_tqdm") is not None:
        put("progress_bar", not trl["disable_tqdm"], f"disable_tqdm={trl['disable_tqdm']}")
    if "shuffle_dataset" in trl:
        put("shuffle", bool(trl["shuffle_dataset"]), f"shuffle_dataset={trl['shuffle_dataset']}")
    if trl.get("use_vllm"):  # vllm_mode and vllm_server_* are grpokit's fields too (colocate, or server: a vllm serve)
        put("engine", "vllm", "use_vllm=True")
    elif trl.get("use_vllm") is False:
        put("engine", "hf", "use_vllm=False")
    generate_only = generate_only_keys(values.get("generation_kwargs"))
    if generate_only and "engine" not in values and context.get("engine", "hf") == "hf":
        values["engine"] = "transformers"  # as TRL: transformers' generate with every key given
    if "sync_ref_model" in trl:
        steps = values.get("ref_model_sync_steps", TRL_DEFAULTS["ref_model_sync_steps"]) if trl["sync_ref_model"] else 0
        values["ref_model_sync_steps"] = steps
    if trl.get("vllm_importance_sampling_clip_max") is not None:
        clip = trl["vllm_importance_sampling_clip_max"]
        put("vllm_importance_sampling_cap", clip, "vllm_importance_sampling_clip_max")
    resume = trl.get("resume_from_checkpoint")
    if resume:
        put("resume_from", "latest" if resume is True else str(resume), f"resume_from_checkpoint={resume!r}")


def _generation_batch(trl: dict, values: dict, context: dict, put, trl_keywords: frozenset = frozenset()) -> None:
    """steps_per_generation / generation_batch_size as num_mini_batches (whole optimizer steps per generation), and
    TRL's step counts as generation batches: with either of them, or with ``num_iterations`` given the TRL way (TRL's
    steps_per_generation then defaults to gradient_accumulation_steps: one optimizer step per pass over the batch,
    so a generation batch is num_iterations optimizer steps)."""
    accumulation = _int(values.get("gradient_accumulation_steps", context.get("gradient_accumulation_steps")), 1)
    micro_batch = _int(values.get("per_device_train_batch_size", context.get("per_device_train_batch_size")), 8)
    processes = int(os.environ.get("WORLD_SIZE", "1"))  # torchrun's
    minis = _mini_batches(trl.get("steps_per_generation"), trl.get("generation_batch_size"), micro_batch * processes)
    if minis is None and "num_iterations" in trl_keywords:
        iterations = _int(values.get("num_iterations"), 1)
        _count_generation_batches(values, iterations, f"num_iterations={iterations} (TRL reuses each batch that often)")
    if minis is not None:
        key = "steps_per_generation" if trl.get("steps_per_generation") is not None else "generation_batch_size"
        source = f"{key}={trl[key]}"
        if minis % accumulation:
            raise TRLValueError(
                f"{source} makes {minis} micro-batches per generation batch, not a multiple of "
                f"gradient_accumulation_steps ({accumulation}): grpokit feeds whole optimizer steps from a generation "
                "batch; make it a multiple, or set num_mini_batches (optimizer steps per generation batch)."
            )
        put("num_mini_batches", minis // accumulation, source)
        iterations = _int(values.get("num_iterations", context.get("num_iterations")), 1)
        if iterations > 1:
            source += f" with num_iterations={iterations}"
        _count_generation_batches(values, minis // accumulation * iterations, source)


def _unused_keys(trl: dict, put, unused: dict) -> None:
    """The TRL-only keys that ask for something grpokit does not do (not at TRL's default), for one warning."""
    optim = getattr(trl.get("optim"), "value", trl.get("optim"))  # transformers' OptimizerNames is a str enum
    if optim in OPTIMIZERS:
        put("optimizer", optim, f"optim={optim!r}")
    checks = {  # values that ask for what grpokit does anyway
        "optim": lambda v: v in OPTIMIZERS,
        "logging_strategy": lambda v: v == "steps",
        # each process reads its own batches (dispatch_batches False / unset); any other setting is accelerate's
        "accelerator_config": lambda v: (
            accelerator_settings(v).keys() <= {"dispatch_batches"}
            and not accelerator_settings(v).get("dispatch_batches")
        ),
    }
    for key, value in trl.items():
        if key in checks:
            if not checks[key](value):
                unused[key] = value
        elif key not in TRANSLATED and (key in ALWAYS_NAMED or not _same(value, TRL_DEFAULTS.get(key))):
            unused[key] = value


def _count_generation_batches(values: dict[str, Any], per_batch: int, source: str) -> None:
    """TRL's ``max_steps``, ``save_steps``, ``eval_steps`` and ``logging_steps`` count optimizer steps; grpokit's
    count generation batches of ``per_batch`` optimizer steps each (steps_per_generation / gradient accumulation,
    times num_iterations: TRL reuses a generation batch num_iterations times). Convert the given ones, so a TRL
    script runs as many optimizer steps on as many completions as under TRL: ``max_steps`` must be a whole number
    of generation batches, the others round up to one."""
    if per_batch == 1:
        return
    max_steps = values.get("max_steps")
    if isinstance(max_steps, int) and max_steps > 0:
        if max_steps % per_batch:
            raise TRLValueError(
                f"max_steps={max_steps} (optimizer steps, as TRL counts them) is not a whole number of generation "
                f"batches: {source} makes {per_batch} optimizer steps per generation batch. Make max_steps a "
                f"multiple of {per_batch} (e.g. {max_steps // per_batch * per_batch or per_batch})."
            )
        values["max_steps"] = max_steps // per_batch
    for key in ("save_steps", "eval_steps", "logging_steps"):
        if isinstance(values.get(key), int) and values[key] > 0:
            values[key] = math.ceil(values[key] / per_batch)


def _mini_batches(steps: Any, batch_size: Any, per_micro_step: int) -> int | None:
    """TRL's ``steps_per_generation`` (micro-batches per generation batch), given directly or as
    ``generation_batch_size`` (completions per generation batch over all processes); None when neither is set."""
    if steps is not None and batch_size is not None:
        raise TRLValueError("steps_per_generation and generation_batch_size cannot both be set (as in TRL); keep one.")
    for key, value in (("steps_per_generation", steps), ("generation_batch_size", batch_size)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise TRLValueError(f"{key}={value!r} must be a positive integer.")
    if batch_size is None:
        return steps
    if batch_size % per_micro_step:
        raise TRLValueError(
            f"generation_batch_size={batch_size} is not divisible by per_device_train_batch_size x processes "
            f"({per_micro_step}), as TRL requires too."
        )
    return batch_size // per_micro_step


def _int(value: Any, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else default
