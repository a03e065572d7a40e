"""How much memory a training process needs: a pure function of :class:`MemoryInputs` (the model's shape from its
architecture on the meta device, :mod:`grpokit.memory.shape`; the run's sizes and choices, filled from a config by
``memory_inputs`` in grpokit/compose/memory.py). Each part is what grpokit itself allocates, in bytes, per process:

    weights      P x b                    P parameters in the weights' dtype (b bytes); 4-bit (QLoRA): the
                                          Linear weights but the LM head in NF4 with their quantisation
                                          constants (:func:`nf4_bytes`), the rest float32 (peft's k-bit
                                          preparation upcasts it)
    reference    beta > 0 without LoRA: a frozen copy; under bf16 autocast its Linear layers are
                 kept in bf16 (``kernels/linear_storage.py``), with ``ref_model_dtype: bfloat16`` all of
                 it (P x 2); with LoRA: none (adapters disabled)
    gradients    P_t x b                  P_t trainable parameters (all, or LoRA's adapters; float32 under 4-bit)
    AdamW        2 x P_t x b              two moments; 8-bit (bitsandbytes' AdamW8bit): 2 x (1 + 4 / 256) B per
                                          value of a parameter of >= 4096 values (8-bit codes and a float32 scale
                                          per block of 256), 2 x 4 B per value of the smaller ones
    optimizer    8-bit AdamW on CPU: 5 x 4 B x the largest 8-bit parameter or slice of one (the step dequantises
    step         both moments of a slice of at most 2**22 values to float32 and adds its scaled gradient, a square
                 root and the denominator, ``train/learning/adamw8bit.py``); the fused AdamW: none
    teacher      a local distillation teacher on the student's device (``teacher_model_name_or_path``, no
                 ``teacher_device`` of its own): its P_teacher parameters x the bytes of ``teacher_dtype``, held
                 for the whole run (its scoring passes' activations are not counted)
    micro-batch  one micro-batch of the update:
                 saved activations  tokens x layers x a, per token and layer a = 33 h + 7 i (+ 6 heads c)
                                    bytes under bf16 autocast (8 h less through the lean RMSNorms, 2 h
                                    + 4 i less through the lean MLP on CPU), 39 h + 14 i (+ 4 heads c)
                                    in one dtype (the lean norms counted in),
                                    8 i less through the lean float32 MLP (h hidden, i MLP width; the
                                    heads x c term, c the context, while the plain CPU attention keeps
                                    its probabilities); tokens = completions x T
                                    + their groups' prompts once (shared prefix). The constants are
                                    fitted to the saved tensors of two Qwen2 shapes (h 512, i 1408 and
                                    h 768, i 768); at 256-token completions the estimate was 10 % low.
                                    At Qwen2.5-0.5B's shape in float32 it was 21 % low until the lean
                                    RMSNorms and the grouped-query SDPA (K/V unrepeated); with them it is
                                    1 % low (docs/performance.md).
                                    With activation checkpointing: layer inputs plus one layer.
                 logits kept for the backward (up to 64 MiB, else recomputed) and the head's chunks
                 autocast's cast of every Linear weight, saved for the backward (2 B each; 4-bit layers
                 save their 4-bit weight and dequantise it again in the backward)
    generation   KV cache: completions x (prompt + T) x layers x 2 x kv_heads x head_dim (float32 under
                 autocast) and, for Llama-family models, the fused decoder's copy of the Linear weights
                 (none with a 4-bit base: its layers decode through the HF forward)

    peak = weights + reference + teacher + AdamW + max(gradients + max(micro-batch, optimizer step), generation)

That is the tensors' share. The process adds its runtime (Python, PyTorch and their libraries:
~0.25 GB resident on CPU) and allocator overhead (gradients in flight during the backward, freed
blocks kept for reuse). ``python bench/memory_estimate.py`` compares the estimate with the peak
resident memory of real runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from grpokit.kernels.attention import PROBS_BUDGET
from grpokit.kernels.fused_decoder import SUPPORTED as FUSED_DECODER_TYPES
from grpokit.kernels.fused_head import CHUNK_ELEMENTS, SAVED_LOGITS_BYTES


@dataclass(frozen=True)
class ModelShape:
    """A causal LM's sizes (:func:`grpokit.memory.shape.model_shape` reads them from a meta-device model)."""

    parameters: int
    untied_linear: int  # values of the Linear layers not tied to another parameter (the reference's bf16 share)
    linear: int  # values of every Linear weight, a tied LM head included
    four_bit_linears: tuple[int, ...]  # the size of each Linear weight load_in_4bit quantises (all but the LM head)
    hidden_size: int
    intermediate_size: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab_size: int
    model_type: str | None = None


@dataclass(frozen=True)
class MemoryInputs:
    """Everything the estimate reads: the model's shape and the run's sizes and choices, already resolved (the
    precision the run computes in, the LoRA adapters' sizes, whether the lean MLP runs)."""

    shape: ModelShape
    trainable: tuple[int, ...]  # the size of each parameter training updates (all, or LoRA's adapters)
    device_type: str  # "cpu", "cuda" ...
    weight_bytes: int  # b: bytes per value of the weights' dtype
    completion_tokens: int  # T, max_completion_length
    prompt_tokens: int  # P, the longest prompt (0: none counted)
    num_generations: int  # G, completions per prompt (a group's prompt is run once)
    step_rows: int  # a step's completions on this process, sampled together
    micro_batch: int  # completions per micro-batch of the update
    backward_chunk_rows: int | None  # rows per forward and backward pass; None: the whole micro-batch
    gradient_checkpointing: bool
    load_in_4bit: bool
    mixed: bool = False  # the update runs under bf16 autocast
    sampling_bf16: bool = False  # the sampler runs in bf16 (a CPU may sample in another dtype than it learns in)
    lean_mlp: bool = False  # the learner's passes run the lean MLP (kernels/lean_mlp.py; under autocast on CPU only)
    lean_norm: bool = False  # the learner's passes run the lean RMSNorm (kernels/lean_norm.py)
    lora: bool = False  # LoRA adapters train (the reference is the base with adapters off)
    reference: bool = False  # a frozen reference copy is held (beta > 0 without LoRA)
    reference_synced: bool = False  # ref_model_sync_steps: the copy stays in the weights' dtype under autocast
    reference_bf16: bool = False  # ref_model_dtype: bfloat16, the whole copy in bf16
    eight_bit_adamw: bool = False  # bitsandbytes' AdamW8bit
    teacher_parameters: int = 0  # a local distillation teacher's parameters on this device (0: none here)
    teacher_bytes: int = 0  # bytes per value of the teacher's dtype


@dataclass
class MemoryEstimate:
    parameters: int
    trainable: int
    weights: int
    reference: int
    gradients: int
    adamw: int
    micro_batch: int
    generation: int
    backward_chunk_rows: int  # rows per forward and backward pass of the update
    optimizer_step: int = 0
    teacher: int = 0  # a local distillation teacher's weights on this device
    # the micro-batch's and generation's parts by name (saved activations, kept logits, the head's chunks, autocast's
    # weight casts; KV cache, the fused decoder's weight copy), for reports that list what is above the weights
    parts: dict = field(default_factory=dict)

    @property
    def peak(self) -> int:
        learner = self.gradients + max(self.micro_batch, self.optimizer_step)
        return self.weights + self.reference + self.teacher + self.adamw + max(learner, self.generation)


# bitsandbytes' NF4 with double quantisation, as ``models.loading.four_bit_config`` asks for it
NF4_BLOCK = 64  # values per absmax
NF4_NESTED_BLOCK = 256  # absmax values per float32 second-level absmax


def nf4_bytes(n: int) -> int:
    """Bytes of one weight of ``n`` values in NF4 with double quantisation (QLoRA, Dettmers et al. 2023), as
    bitsandbytes holds it: the 4-bit codes (n / 2), one 8-bit absmax per block of 64 values, one float32 absmax
    per 256 blocks, and per weight its two code books (256 and 16 float32) and a float32 offset. For a large
    weight that is 4 + 8 / 64 + 32 / (64 x 256) = 4.127 bits per value."""
    blocks = -(-n // NF4_BLOCK)
    return -(-n // 2) + blocks + 4 * -(-blocks // NF4_NESTED_BLOCK) + (256 + 16 + 1) * 4


# bitsandbytes' AdamW8bit: parameters of at least this many values get 8-bit moments, with a float32 scale per block
EIGHT_BIT_MIN_SIZE = 4096
EIGHT_BIT_BLOCK = 256
EIGHT_BIT_SLICE = 2**22  # values per slice of the CPU step (train/learning/adamw8bit.py, which imports bitsandbytes)


def adamw_bytes(sizes: tuple[int, ...] | list[int], b: int, eight_bit: bool) -> int:
    """Bytes of AdamW's two moments for parameters of ``sizes`` values in ``b``-byte floats, or in bitsandbytes'
    AdamW8bit (``eight_bit``; the module docstring)."""
    if not eight_bit:
        return 2 * sum(sizes) * b
    small = sum(n for n in sizes if n < EIGHT_BIT_MIN_SIZE)
    big = [n for n in sizes if n >= EIGHT_BIT_MIN_SIZE]
    return 2 * small * 4 + 2 * sum(n + 4 * -(-n // EIGHT_BIT_BLOCK) for n in big)


def memory_estimate(x: MemoryInputs) -> MemoryEstimate:
    """Bytes of each part (the module docstring) of training with ``x``."""
    s, b = x.shape, x.weight_bytes
    compute = 2 if x.mixed or b == 2 else 4  # bytes per element of matmul inputs and outputs
    sampling = 2 if x.sampling_bf16 or b == 2 else 4  # the fused decoder's weight copies
    quantised = sum(s.four_bit_linears) if x.load_in_4bit else 0
    # QLoRA: NF4 Linear weights, the rest and the adapters float32
    if x.load_in_4bit:
        weights = sum(map(nf4_bytes, s.four_bit_linears)) + (s.parameters - quantised) * 4
    else:
        weights = s.parameters * b
    trainable_bytes = 4 if x.load_in_4bit else b
    reference = 0
    if x.reference:
        in_bf16 = s.parameters if x.reference_bf16 else (s.untied_linear if x.mixed and not x.reference_synced else 0)
        reference = in_bf16 * 2 + (s.parameters - in_bf16) * b
    trainable = sum(x.trainable)
    largest_8bit = min(max((n for n in x.trainable if n >= EIGHT_BIT_MIN_SIZE), default=0), EIGHT_BIT_SLICE)

    T, P = x.completion_tokens, x.prompt_tokens
    kv_cache = x.step_rows * (P + T) * s.layers * 2 * s.kv_heads * s.head_dim * (4 if x.mixed or sampling == 2 else b)
    fused = s.model_type in FUSED_DECODER_TYPES and not x.load_in_4bit
    mb = min(x.backward_chunk_rows or x.micro_batch, x.micro_batch)  # rows per forward and backward pass
    activations = saved_activations(x, compute, mb)
    logits = mb * T * s.vocab_size * compute
    kept_logits = logits if logits <= SAVED_LOGITS_BYTES else 0
    # every Linear's bf16 weight is saved for the backward (frozen ones too: the input's gradient needs it), LoRA's
    # adapters besides
    casts = (s.linear - quantised + (trainable if x.lora else 0)) * 2 if x.mixed else 0
    head_chunks = 2 * min(CHUNK_ELEMENTS, mb * T * s.vocab_size) * 4  # two float32 chunks of logits at a time
    return MemoryEstimate(
        parameters=s.parameters,
        trainable=trainable,
        weights=weights,
        reference=reference,
        gradients=trainable * trainable_bytes,
        adamw=adamw_bytes(x.trainable, trainable_bytes, x.eight_bit_adamw),
        micro_batch=activations + kept_logits + head_chunks + casts,
        generation=kv_cache + (s.linear * sampling if fused else 0),
        optimizer_step=5 * 4 * largest_8bit if x.eight_bit_adamw and x.device_type == "cpu" else 0,
        teacher=x.teacher_parameters * x.teacher_bytes,
        backward_chunk_rows=mb,
        parts={
            "activations": activations,
            "kept_logits": kept_logits,
            "head_chunks": head_chunks,
            "weight_casts": casts,
            "kv_cache": kv_cache,
            "decoder_weights": s.linear * compute if fused else 0,
        },
    )


def saved_activations(x: MemoryInputs, compute: int, rows: int) -> int:
    """What a forward pass over ``rows`` completions keeps for its backward."""
    s, T, P = x.shape, x.completion_tokens, x.prompt_tokens
    per_token = activation_bytes_per_token(x, compute, rows)
    if x.gradient_checkpointing:  # full rows (no shared prefix): each layer's input, plus one layer recomputed
        return rows * (P + T) * (s.layers * s.hidden_size * x.weight_bytes + per_token)
    return (rows * T + -(-rows // x.num_generations) * P) * s.layers * per_token  # each group's prompt once


def activation_bytes_per_token(x: MemoryInputs, compute: int, rows: int) -> int:
    """Bytes one token saves for the backward in one decoder layer (the module docstring's a): 33 h + 7 i under
    bf16 autocast, 39 h + 14 i in one dtype, 8 i less where the lean MLP keeps gate and up only, plus the attention
    probabilities grpokit's plain CPU attention keeps for small calls of ``rows`` rows (SDPA keeps none)."""
    s = x.shape
    h, i, heads = s.hidden_size, s.intermediate_size, s.heads
    T, context = x.completion_tokens, x.prompt_tokens + x.completion_tokens
    plain = x.device_type == "cpu" and not x.gradient_checkpointing and rows * heads * T * context * 4 <= PROBS_BUDGET
    probs = heads * context * (6 if compute == 2 else 4) * plain
    if compute == 2:  # the lean norms keep x, not x * rsqrt (2 x 4 h); the lean MLP x's cast once, gate and up
        return 33 * h + 7 * i - (8 * h if x.lean_norm else 0) - (2 * h + 4 * i if x.lean_mlp else 0) + probs
    return 39 * h + (6 if x.lean_mlp else 14) * i + probs
