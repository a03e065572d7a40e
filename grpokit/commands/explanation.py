"""`grpokit explain`: the resolved config, the sizes it implies, and the first prompt as built, without loading
weights."""

from __future__ import annotations

import yaml

from grpokit.compose.memory import estimate_memory, fit_warning
from grpokit.compose.rollouts import engine_kind
from grpokit.config import GRPOConfig
from grpokit.kernels.cpu_precision import run_compute
from grpokit.machine.hardware import pick_device
from grpokit.memory.fit import available_bytes, process_bytes
from grpokit.memory.shape import build_meta_model
from grpokit.train.learning.optimizer_settings import EIGHT_BIT_OPTIMIZERS


def explain(cfg: GRPOConfig, world_size: int = 1) -> str:
    """The resolved config, the derived sizes and memory estimate, and the first training prompt as built."""
    return "\n".join([_sizes(cfg, world_size), "", *first_prompt(cfg)])


def _sizes(cfg: GRPOConfig, world_size: int) -> str:
    B, N = cfg.prompts_per_step(world_size), cfg.completions_per_step(world_size)
    T, P = cfg.max_completion_length, cfg.max_prompt_length or 0
    mini = cfg.num_mini_batches
    lines = ["# resolved config", cfg.to_yaml().rstrip(), "", "# derived sizes"]
    lines += [
        f"prompts per step:          {B}",
        f"completions per step:      {N}  (num_generations {cfg.num_generations} x {B} prompts)",
        f"micro-batches per step:    {cfg.gradient_accumulation_steps * mini} of {cfg.per_device_train_batch_size} "
        "completions" + (f", in {mini} mini-batches of one optimizer step each" if mini > 1 else ""),
        f"optimizer steps in total:  {cfg.max_steps * cfg.optimizer_steps_per_step()}  (max_steps {cfg.max_steps} x "
        f"num_iterations {cfg.num_iterations}" + (f" x num_mini_batches {cfg.num_mini_batches})" if mini > 1 else ")")
        if cfg.max_steps > 0
        else f"steps:                     num_train_epochs {cfg.num_train_epochs:g} x (train prompts // {B}), "
        "counted when the data is loaded",
        f"tokens per step (at most): {B * P + N * T:,}  (prompts {B} x {P} once per group + completions {N} x {T})",
    ]
    m, reason = None, "no model_name_or_path"
    try:  # explain works even when the model cannot be inspected here (offline, not a HF model, peft missing)
        if cfg.model_name_or_path:
            model = build_meta_model(cfg.model_name_or_path, cfg.trust_remote_code)
            m = estimate_memory(cfg, model)
    except Exception as exc:
        reason = f"{type(exc).__name__}: {exc}".splitlines()[0][:200]
    if m is None:
        lines.append(f"memory estimate:           unavailable ({reason})")
        return "\n".join(lines)
    parts = [
        ("weights", m.weights),
        ("reference", m.reference),
        *([("teacher (distillation)", m.teacher)] if m.teacher else []),
        ("gradients", m.gradients),
        ("AdamW moments" + (" (8-bit)" if cfg.optimizer in EIGHT_BIT_OPTIMIZERS else ""), m.adamw),
        ("one micro-batch", m.micro_batch),
        ("generation", m.generation),
    ] + ([("optimizer step", m.optimizer_step)] if m.optimizer_step else [])
    lines.append(
        f"parameters:                {m.parameters:,}"
        + (f" ({m.trainable:,} trainable: LoRA)" if cfg.lora.r > 0 else "")
    )
    lines.append(
        f"memory estimate (tensors): {_size(m.peak)} at the peak = weights + reference"
        + (" + teacher" if m.teacher else "")
        + " + AdamW + max(gradients + max(micro-batch, optimizer step), generation); see grpokit/memory/estimate.py"
    )
    lines += [f"  {name + ':':<24}{_size(value)}" for name, value in parts]
    lines.append(
        f"  (a micro-batch's forward and backward run {m.backward_chunk_rows} rows at a time: backward_chunk_rows)"
    )
    lines.append(
        "  plus the process itself (runtime, allocator, buffers in flight): 0.5-0.8 GiB more at the peak"
        " in bench/memory_estimate.py's CPU runs"
    )
    device = pick_device(cfg.device)
    free = available_bytes(device)
    if free is not None:
        need = process_bytes(m, device)
        lines.append(
            f"fits here:                 {'yes' if need <= free else 'NO'} (about {_size(need)} with the process, "
            f"{_size(free)} free on {device.type}; per process)"
        )
    warning = fit_warning(cfg, model, m, device, world_size)
    if warning:
        lines.append(f"warning: {warning}")
    compute = run_compute(
        cfg.dtype,
        device,
        model,
        cfg.mixed_precision,
        sample_rows=cfg.completions_per_step(),
        world_size=world_size,
        own_sampler=engine_kind(cfg.engine).own_sampler,
    )
    lines += ["", "# compute precision (weights and optimizer state float32 under dtype auto)", *compute.notes]
    return "\n".join(lines)


def first_prompt(cfg: GRPOConfig) -> list[str]:
    """Lines showing train_dataset's first prompt as the model reads it (built from the row by prompt_template /
    system_prompt, rendered by the tokenizer's chat template) and the columns the reward functions get; a line
    saying why when the data or the tokenizer cannot be loaded here."""
    from grpokit.compose.specs import prompt_builder
    from grpokit.data.prompts import load_rows, render_prompt
    from grpokit.data.sources import read_source

    head = "# first prompt (train_dataset row 0, as the model reads it)"
    if cfg.train_dataset is None:
        return [head, "unavailable: no train_dataset"]
    try:  # the first row only is built and checked: training checks them all
        first = read_source(cfg.train_dataset)[:1]
        row = load_rows(first, cfg.prompt_column, prompts=prompt_builder(cfg))[0]
    except Exception as exc:  # the data cannot be read here (offline hub, missing file): say so and go on
        return [head, f"unavailable: {_reason(exc)}"]
    prompt = row[cfg.prompt_column]
    columns = ", ".join(k for k in row if k != cfg.prompt_column) or "none"
    tail = [f"# reward functions also get the columns: {columns}"]
    if isinstance(prompt, str):
        return [head, prompt, *tail]
    name = cfg.tokenizer_name_or_path or cfg.model_name_or_path
    try:
        from grpokit.models.loading import load_tokenizer

        if not name:
            raise ValueError("no model_name_or_path")
        text, _ = render_prompt(load_tokenizer(name, cfg.trust_remote_code), prompt)
    except Exception as exc:  # no tokenizer here: show the messages the chat template will render
        messages = yaml.safe_dump(prompt, sort_keys=False, allow_unicode=True, width=120).rstrip()
        return [head, f"(chat messages; the chat template is unavailable: {_reason(exc)})", messages, *tail]
    return [head, text, *tail]


def _reason(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}".splitlines()[0][:300]


def _size(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"
