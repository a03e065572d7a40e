"""The memory estimate of a config (grpokit/memory/estimate.py gives the terms): its typed inputs built from the
config in one place (:func:`memory_inputs`), and what the config's what-if variants need (``cfg.replace(...)``: a
smaller micro-batch, LoRA, ...) for `grpokit explain`, the root's fit warning and the update's rows per pass."""

from __future__ import annotations

import dataclasses
import functools
import warnings
from collections.abc import Callable

import torch

from grpokit.config import GRPOConfig
from grpokit.kernels.cpu_precision import run_compute
from grpokit.kernels.lean_mlp import MODEL_TYPES as LEAN_MLP_TYPES
from grpokit.machine.hardware import pick_device, pick_dtype
from grpokit.memory.estimate import MemoryEstimate, MemoryInputs, memory_estimate
from grpokit.memory.fit import available_bytes, process_bytes
from grpokit.memory.shape import build_meta_model, model_shape, trainable_sizes
from grpokit.models.lora_targets import adapts_any
from grpokit.train.learning.optimizer_settings import EIGHT_BIT_OPTIMIZERS
from grpokit.train.teacher.settings import built_in_memory


def memory_inputs(cfg: GRPOConfig, model: torch.nn.Module, device: torch.device | None = None) -> MemoryInputs:
    """The estimate's inputs for training ``model`` (meta-device, from :func:`build_meta_model`; LoRA is counted on a
    copy) under ``cfg`` on ``device`` (default: the one training would pick here)."""
    device = device or pick_device(cfg.device)
    chosen = run_compute(cfg.dtype, device, model, cfg.mixed_precision, sample_rows=cfg.completions_per_step())
    teacher_parameters, teacher_bytes = local_teacher_size(cfg, device)
    return MemoryInputs(
        shape=model_shape(model),
        trainable=trainable_sizes(model, cfg.lora),
        device_type=device.type,
        weight_bytes=torch.finfo(pick_dtype(cfg.dtype, device)).bits // 8,
        completion_tokens=cfg.max_completion_length,
        prompt_tokens=cfg.max_prompt_length or 0,
        num_generations=cfg.num_generations,
        step_rows=cfg.completions_per_step(),
        micro_batch=cfg.per_device_train_batch_size,
        backward_chunk_rows=cfg.backward_chunk_rows,
        mixed=chosen.learning is not None,
        sampling_bf16=chosen.sampling is not None,
        # under autocast the lean MLP runs on CPU only (kernels/lean_mlp.py)
        lean_mlp=lean_mlp_applies(cfg, model.config) and (chosen.learning is None or device.type == "cpu"),
        lean_norm=getattr(model.config, "model_type", None) in LEAN_MLP_TYPES and not cfg.gradient_checkpointing,
        gradient_checkpointing=cfg.gradient_checkpointing,
        load_in_4bit=cfg.load_in_4bit,
        lora=cfg.lora.r > 0,
        reference=cfg.beta > 0 and cfg.lora.r == 0,
        reference_synced=bool(cfg.ref_model_sync_steps),
        reference_bf16=cfg.ref_model_dtype == "bfloat16",
        eight_bit_adamw=cfg.optimizer in EIGHT_BIT_OPTIMIZERS,
        teacher_parameters=teacher_parameters,
        teacher_bytes=teacher_bytes,
    )


def estimate_memory(cfg: GRPOConfig, model: torch.nn.Module, device: torch.device | None = None) -> MemoryEstimate:
    """The estimate (grpokit/memory/estimate.py) of training ``model`` under ``cfg`` on ``device``."""
    return memory_estimate(memory_inputs(cfg, model, device))


def local_teacher_size(cfg: GRPOConfig, device: torch.device) -> tuple[int, int]:
    """(parameters, bytes per value) of the run's local distillation teacher when it sits on ``device`` (no
    ``teacher_device`` of its own, or that same device); (0, 0) without one there, and for a module built in
    memory and passed as ``teacher_model``: it is in memory before the run is built, so free memory excludes it."""
    name = cfg.teacher_model_name_or_path
    elsewhere = cfg.teacher_device is not None and pick_device(cfg.teacher_device) != device
    if not name or built_in_memory(name) or elsewhere:
        return 0, 0
    from grpokit.train.teacher.local import teacher_dtype

    return _parameters(name, cfg.trust_remote_code), torch.finfo(teacher_dtype(cfg.teacher_dtype, device)).bits // 8


@functools.lru_cache(maxsize=8)
def _parameters(name_or_path: str, trust_remote_code: bool) -> int:
    """The parameters of the causal LM ``name_or_path`` (its architecture on the meta device; read once)."""
    return sum(p.numel() for p in build_meta_model(name_or_path, trust_remote_code).parameters())


def lean_mlp_applies(cfg: GRPOConfig, config) -> bool:
    """Whether the learner's float32 passes run ``config``'s MLPs through the lean MLP (``kernels/lean_mlp.py``):
    a Llama-family model whose MLP Linears are plain (no LoRA on them, not 4-bit), without activation
    checkpointing."""
    lora_on_mlp = cfg.lora.r > 0 and adapts_any(
        cfg.lora.target_modules, getattr(config, "model_type", None), ("gate_proj", "up_proj", "down_proj")
    )
    return (
        getattr(config, "model_type", None) in LEAN_MLP_TYPES
        and getattr(config, "hidden_act", None) == "silu"
        and not getattr(config, "mlp_bias", False)
        and not (cfg.load_in_4bit or cfg.gradient_checkpointing or lora_on_mlp)
    )


# A pass reads every weight once (and again in the backward): below this many completion tokens its matmuls stop
# being compute-bound on a CPU, so a pass is never made smaller than that.
MIN_PASS_TOKENS = 256


def pass_sizes(cfg: GRPOConfig) -> list[int]:
    """The rows per forward and backward pass worth trying below the micro-batch, largest first: multiples of the
    group size (each pass runs its groups' prompts once), then divisors of it (passes do not straddle groups), none
    under MIN_PASS_TOKENS completion tokens."""
    mb, G = cfg.per_device_train_batch_size, cfg.num_generations
    least = -(-MIN_PASS_TOKENS // cfg.max_completion_length)
    sizes = [r for r in range(mb - 1, G - 1, -1) if r % G == 0] + [d for d in range(G - 1, 0, -1) if G % d == 0]
    return [r for r in sizes if r >= least and r < mb]


def backward_chunk_rows(cfg: GRPOConfig, fits: Callable[[int], bool]) -> int:
    """Rows per forward and backward pass of a micro-batch: ``backward_chunk_rows`` when set; else the whole
    micro-batch when ``fits(rows)`` says it fits in memory (one pass is fastest: every pass rereads the weights; at
    Qwen2.5-0.5B's shape on a CPU, passes of 8 or 4 rows cost a third more step time, docs/performance.md), or when
    ``top_entropy_quantile`` < 1 (its quantile needs the whole micro-batch's entropies); else the largest of
    :func:`pass_sizes` that fits, or the smallest when none does."""
    mb = cfg.per_device_train_batch_size
    if cfg.backward_chunk_rows:
        return min(cfg.backward_chunk_rows, mb)
    if cfg.top_entropy_quantile < 1.0 or fits(mb):
        return mb
    sizes = pass_sizes(cfg)
    return next((rows for rows in sizes if fits(rows)), sizes[-1] if sizes else mb)


def update_chunk_rows(
    cfg: GRPOConfig,
    model: torch.nn.Module,
    device: torch.device,
    processes: int = 1,
    prompt_tokens: int | None = None,
) -> int:
    """The update's rows per forward and backward pass for ``model`` (:func:`backward_chunk_rows`): the estimate of
    its architecture on the meta device with the process against the memory free now (on CPU shared by the
    ``processes`` of this host, as :func:`fit_warning` shares it); the micro-batch for a model without a transformers
    config, or where the free memory is unknown. ``prompt_tokens``: the run's longest prompt, estimated in place of
    ``max_prompt_length`` (a bound, 512 by default, or none at all), once the prompts are tokenised."""
    mb = cfg.per_device_train_batch_size
    config = getattr(model, "config", None)
    free = available_bytes(device)
    if free is not None and device.type == "cpu":
        free //= processes
    if cfg.backward_chunk_rows or free is None or config is None or not hasattr(config, "num_hidden_layers"):
        return min(cfg.backward_chunk_rows or mb, mb)
    from transformers import AutoModelForCausalLM

    try:
        with torch.device("meta"):
            meta = AutoModelForCausalLM.from_config(config, trust_remote_code=cfg.trust_remote_code)
    except (ValueError, KeyError, TypeError):  # not a causal LM transformers can build from its config
        return mb
    if prompt_tokens is not None:
        cfg = cfg.replace(max_prompt_length=prompt_tokens)
    with warnings.catch_warnings():  # the config's warnings were given when it was built
        warnings.simplefilter("ignore")
        inputs = memory_inputs(cfg, meta, device)

    def fits(rows: int) -> bool:
        estimate = memory_estimate(dataclasses.replace(inputs, backward_chunk_rows=rows))
        return process_bytes(estimate, device) <= free

    return backward_chunk_rows(cfg, fits)


def memory_warning(cfg: GRPOConfig, name_or_path: str, device: torch.device, processes: int = 1) -> str | None:
    """A message when ``processes`` processes on this host training ``name_or_path`` would need more memory than
    ``device`` has free (:func:`fit_warning`), else None (also when the model's config cannot be read: not a HF
    model, a hub id offline)."""
    try:
        model = build_meta_model(name_or_path, cfg.trust_remote_code)
        estimate = estimate_memory(cfg, model, device)
    except Exception:
        return None
    return fit_warning(cfg, model, estimate, device, processes)


def fit_warning(
    cfg: GRPOConfig, model: torch.nn.Module, estimate: MemoryEstimate, device: torch.device, processes: int = 1
) -> str | None:
    """A message when ``processes`` processes needing ``estimate`` each (``model`` on the meta device) would need
    more memory than ``device`` has free, naming the settings that would fit (:func:`fitting_settings`); else
    None (also when the free memory is unknown)."""
    free = available_bytes(device)
    needed = process_bytes(estimate, device) * (processes if device.type == "cpu" else 1)
    if free is None or needed <= free:
        return None
    fits, others = fitting_settings(cfg, model, device, free // (processes if device.type == "cpu" else 1))
    advice = (
        "These settings would fit (estimate per process): " + "; ".join(fits) + "."
        if fits
        else "None of these settings alone would fit (estimate per process): "
        + "; ".join(others)
        + ". Use a smaller model or a machine with more memory."
    )
    return (
        f"this run needs about {needed / 2**30:.1f} GiB of {device.type} memory (`grpokit explain` shows the parts) "
        f"but {free / 2**30:.1f} GiB is free: it may run out of memory. {advice}"
    )


def fitting_settings(
    cfg: GRPOConfig, model: torch.nn.Module, device: torch.device, free: int
) -> tuple[list[str], list[str]]:
    """(the settings that fit in ``free`` bytes, the ones that do not), each as ``"setting (N GiB)"``: the
    largest smaller micro-batch (the same completions per step: gradient accumulation grows to match), the largest
    fewer rows per forward and backward pass (:func:`pass_sizes`; the same numbers),
    gradient checkpointing, the reference in bf16 (its log-probs change slightly), the 8-bit AdamW (its moments
    quantised), LoRA (r 16 unless set), and QLoRA (LoRA on a 4-bit base).
    A setting that cannot be estimated here (peft missing for LoRA) is left out."""
    r = cfg.lora.r or 16
    candidates = []
    mb, accumulation = cfg.per_device_train_batch_size, cfg.gradient_accumulation_steps
    for smaller in range(mb - 1, 0, -1):
        if mb % smaller == 0:
            candidates.append(
                (
                    f"per_device_train_batch_size: {smaller} with gradient_accumulation_steps: "
                    f"{accumulation * mb // smaller}",
                    {
                        "per_device_train_batch_size": smaller,
                        "gradient_accumulation_steps": accumulation * mb // smaller,
                    },
                )
            )
    current = min(cfg.backward_chunk_rows or mb, mb)
    for rows in pass_sizes(cfg):
        if rows < current:
            candidates.append((f"backward_chunk_rows: {rows}", {"backward_chunk_rows": rows}))
    if not cfg.gradient_checkpointing:
        candidates.append(("gradient_checkpointing: true", {"gradient_checkpointing": True}))
    if cfg.ref_model_dtype != "bfloat16" and cfg.beta > 0 and cfg.lora.r == 0 and not cfg.ref_model_sync_steps:
        candidates.append(("ref_model_dtype: bfloat16", {"ref_model_dtype": "bfloat16"}))
    if cfg.optimizer not in EIGHT_BIT_OPTIMIZERS:
        candidates.append(("optimizer: adamw_8bit (the qlora extra's bitsandbytes)", {"optimizer": "adamw_8bit"}))
    if cfg.lora.r == 0:
        candidates.append((f"LoRA (lora.r: {r})", {"lora": {"r": r}}))
    if not cfg.load_in_4bit:
        candidates.append((f"QLoRA (load_in_4bit: true, lora.r: {r})", {"load_in_4bit": True, "lora": {"r": r}}))
    fits, others, sized_fits = [], [], set()
    smallest = {key: min((o[key] for _, o in candidates if key in o), default=None) for key in SIZED}
    for text, overrides in candidates:
        sized = next((key for key in SIZED if key in overrides), None)
        if sized is not None and sized in sized_fits:
            continue  # only the largest micro-batch (rows per pass) that fits
        try:
            need = process_bytes(estimate_memory(cfg.replace(**overrides), model, device), device)
        except Exception:
            continue
        entry = f"{text} ({need / 2**30:.1f} GiB)"
        if need <= free:
            fits.append(entry)
            if sized is not None:
                sized_fits.add(sized)
        elif sized is None or overrides[sized] == smallest[sized]:
            others.append(entry)  # of the micro-batches (rows per pass), only the smallest is named when none fits
    return fits, others


SIZED = ("per_device_train_batch_size", "backward_chunk_rows")  # settings tried at several sizes, largest first
