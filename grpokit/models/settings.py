"""The model's settings (loading, dtypes, device): keys of the ``model`` section, which is assembled from this
class; torch-free, so the config reads it without loading torch (:mod:`grpokit.models.loading` uses them)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ModelSettings:
    """The policy model: where it comes from, its dtypes and device, and how it is loaded."""

    model_name_or_path: str | None = None
    """Local folder or hub id of a causal LM (the `model` argument of GRPOTrainer overrides it)."""
    tokenizer_name_or_path: str | None = None
    """Tokenizer folder or hub id; defaults to the model's."""
    dtype: str = "auto"
    """The trained weights' dtype: auto (float32 on every device; the compute dtype comes from mixed_precision) |
    float32 | bfloat16 | float16 (low-precision weights and AdamW moments: small updates are lost; warned about)."""
    mixed_precision: str = "auto"
    """The autocast (compute) dtype over float32 weights: auto (CUDA: bf16 where the GPU has it natively, else fp16
    with a GradScaler; CPU, models of 10M+ parameters: whichever of float32 and bf16 (fp16 for sampling on AVX512-FP16)
    measured faster on the model's own matmuls, learning and sampling apart, cached (`grpokit env`); else none) | bf16
    | fp16 | no. TRL's bf16=True / fp16=True set it."""
    device: str = "auto"
    """auto (CUDA, then MPS, then CPU) | cpu | cuda | cuda:N | mps."""
    trust_remote_code: bool = False
    """Passed to from_pretrained."""
    gradient_checkpointing: bool = False
    """Recompute activations in backward to save memory (slower)."""
    load_in_4bit: bool = False
    """QLoRA: load the base weights in 4-bit NF4 (bitsandbytes >= 0.48, CPU or CUDA: the qlora extra); needs lora.r >
    0."""
    ref_model_dtype: str = "auto"
    """auto (the reference copy in the policy's dtype; under bf16 autocast its Linear weights in bf16, the values
    autocast computes with) | bfloat16 (every weight of the reference copy stored in bf16 and cast back to the compute
    dtype as each layer runs: about half its memory; its log-probs then differ by the weights' bf16 rounding)."""
