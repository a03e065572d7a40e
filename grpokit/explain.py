"""`grpokit explain`: the resolved config and the sizes it implies, without loading weights."""

from __future__ import annotations

from grpokit.config import GRPOConfig


def count_parameters(model_name_or_path: str, trust_remote_code: bool = False) -> tuple[int, int, int] | None:
    """(parameters, vocabulary size, hidden size) of a HF model, built on the meta device (no weights read)."""
    try:
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM

        config = AutoConfig.from_pretrained(model_name_or_path, trust_remote_code=trust_remote_code)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)
        params = sum(p.numel() for p in model.parameters())
        return params, int(config.vocab_size), int(getattr(config, "hidden_size", 0) or getattr(config, "n_embd", 0))
    except Exception:  # explain must work even when the model cannot be inspected offline
        return None


def explain(cfg: GRPOConfig, world_size: int = 1) -> str:
    B, N = cfg.prompts_per_step(world_size), cfg.completions_per_step(world_size)
    T, P = cfg.max_completion_length, cfg.max_prompt_length or 0
    lines = ["# resolved config", cfg.to_yaml().rstrip(), "", "# derived sizes"]
    lines += [
        f"prompts per step:          {B}",
        f"completions per step:      {N}  (num_generations {cfg.num_generations} x {B} prompts)",
        f"micro-batches per step:    {cfg.gradient_accumulation_steps} of {cfg.per_device_train_batch_size} completions",
        f"optimizer steps in total:  {cfg.max_steps * cfg.num_iterations}  (max_steps {cfg.max_steps} x num_iterations {cfg.num_iterations})",
        f"tokens per step (at most): {B * P + N * T:,}  (prompts {B} x {P} once per group + completions {N} x {T})",
    ]
    info = count_parameters(cfg.model_name_or_path, cfg.trust_remote_code) if cfg.model_name_or_path else None
    if info is None:
        lines.append("memory estimate:           unavailable (model config not readable here)")
        return "\n".join(lines)
    params, vocab, _ = info
    trainable = params if cfg.lora.r == 0 else 0
    weight_bytes = 2 if cfg.dtype in ("bfloat16", "float16") else 4
    weights = params * weight_bytes
    reference = weights if cfg.beta > 0 and cfg.lora.r == 0 else 0
    optimizer = trainable * 4 * 3  # grads + two AdamW moments in float32
    logits = cfg.per_device_train_batch_size * T * vocab * 4 * 2  # logits and their grad for one micro-batch
    total = weights + reference + optimizer + logits
    unit, scale = ("GiB", 1024**3) if total >= 1024**3 else ("MiB", 1024**2)
    lines += [
        f"parameters:                {params:,}",
        f"memory estimate:           {total / scale:.2f} {unit}  = weights {weights / scale:.2f} + reference {reference / scale:.2f}"
        f" + grads/AdamW {optimizer / scale:.2f} + logits {logits / scale:.2f} (activations extra)",
    ]
    return "\n".join(lines)
