"""How much memory a training process needs, from the model's config alone (for ``grpokit explain``).

The model is built on the meta device (no weights read; with LoRA, peft wraps a copy there to count
the adapters), and each part is what grpokit itself allocates, in bytes, per process:

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
    micro-batch  one micro-batch of the update:
                 saved activations  tokens x layers x a, per token and layer a = 33 h + 7 i (+ 6 heads c)
                                    bytes under bf16 autocast, 39 h + 14 i (+ 4 heads c) in one dtype,
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

    peak = weights + reference + AdamW + max(gradients + max(micro-batch, optimizer step), generation)

That is the tensors' share. The process adds its runtime (Python, PyTorch and their libraries:
~0.25 GB resident on CPU) and allocator overhead (gradients in flight during the backward, freed
blocks kept for reuse). ``python bench/memory_estimate.py`` compares the estimate with the peak
resident memory of real runs.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from grpokit.config import GRPOConfig
from grpokit.kernels.attention import PROBS_BUDGET
from grpokit.kernels.cpu_precision import run_compute
from grpokit.kernels.fused_decoder import SUPPORTED as FUSED_DECODER_TYPES
from grpokit.kernels.fused_head import CHUNK_ELEMENTS, SAVED_LOGITS_BYTES
from grpokit.kernels.lean_mlp import MODEL_TYPES as LEAN_MLP_TYPES
from grpokit.kernels.linear_storage import untied_linears
from grpokit.machine.hardware import pick_device, pick_dtype
from grpokit.models.loading import lora_config, model_config
from grpokit.models.lora_targets import adapts_any
from grpokit.train.learning.optimizer_settings import EIGHT_BIT_OPTIMIZERS


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
    backward_chunk_rows: int  # rows per forward and backward pass of the update (:func:`backward_chunk_rows`)
    optimizer_step: int = 0
    # the micro-batch's and generation's parts by name (saved activations, kept logits, the head's chunks, autocast's
    # weight casts; KV cache, the fused decoder's weight copy), for reports that list what is above the weights
    parts: dict = field(default_factory=dict)

    @property
    def peak(self) -> int:
        learner = self.gradients + max(self.micro_batch, self.optimizer_step)
        return self.weights + self.reference + self.adamw + max(learner, self.generation)


def build_meta_model(name_or_path: str, trust_remote_code: bool = False) -> torch.nn.Module:
    """A HF causal LM's architecture (local folder or hub id) on the meta device: shapes, no weights."""
    from transformers import AutoModelForCausalLM

    config = model_config(name_or_path, trust_remote_code)
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)


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


def four_bit_linears(model: torch.nn.Module) -> list[torch.nn.Linear]:
    """The Linear layers ``load_in_4bit`` quantises: all but the LM head (transformers leaves it unquantised)."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    return [m for m in model.modules() if isinstance(m, torch.nn.Linear) and m is not head]


def trainable_sizes(model: torch.nn.Module, cfg: GRPOConfig) -> list[int]:
    """The size of each parameter training updates: every one of ``model`` (a meta-device model), or the LoRA
    adapters training would add to it (counted on a copy; ``model`` is left as it is)."""
    if cfg.lora.r == 0:
        return [p.numel() for p in model.parameters()]
    from peft import get_peft_model

    wrapped = get_peft_model(copy.deepcopy(model), lora_config(cfg.lora))
    return [p.numel() for p in wrapped.parameters() if p.requires_grad]


# bitsandbytes' AdamW8bit: parameters of at least this many values get 8-bit moments, with a float32 scale per block
EIGHT_BIT_MIN_SIZE = 4096
EIGHT_BIT_BLOCK = 256
EIGHT_BIT_SLICE = 2**22  # values per slice of the CPU step (train/learning/adamw8bit.py, which imports bitsandbytes)


def adamw_bytes(sizes: list[int], b: int, eight_bit: bool) -> int:
    """Bytes of AdamW's two moments for parameters of ``sizes`` values in ``b``-byte floats, or in bitsandbytes'
    AdamW8bit (``eight_bit``; the module docstring)."""
    if not eight_bit:
        return 2 * sum(sizes) * b
    small = sum(n for n in sizes if n < EIGHT_BIT_MIN_SIZE)
    big = [n for n in sizes if n >= EIGHT_BIT_MIN_SIZE]
    return 2 * small * 4 + 2 * sum(n + 4 * -(-n // EIGHT_BIT_BLOCK) for n in big)


def estimate_memory(cfg: GRPOConfig, model: torch.nn.Module, device: torch.device | None = None) -> MemoryEstimate:
    """Bytes of each part (module docstring) for training ``model`` (meta-device, from :func:`build_meta_model`;
    LoRA is added here) under ``cfg`` on ``device`` (default: the one training would pick here)."""
    device = device or pick_device(cfg.device)
    chosen = run_compute(cfg.dtype, device, model, cfg.mixed_precision, sample_rows=cfg.completions_per_step())
    mixed = chosen.learning is not None
    b = torch.finfo(pick_dtype(cfg.dtype, device)).bits // 8
    compute = 2 if mixed or b == 2 else 4  # bytes per element of matmul inputs and outputs
    sampling = 2 if chosen.sampling is not None or b == 2 else 4  # the fused decoder's weight copies (a CPU may
    # sample in another dtype than it learns in: grpokit/kernels/cpu_precision.py)
    config = model.config
    params = sum(p.numel() for p in model.parameters())
    untied = sum(p.numel() for m in untied_linears(model) for p in m.parameters(recurse=False))
    linear = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))  # a tied head included
    quantised = [m.weight.numel() for m in four_bit_linears(model)] if cfg.load_in_4bit else []
    # QLoRA: NF4 Linear weights, the rest and the adapters float32
    weights = sum(map(nf4_bytes, quantised)) + (params - sum(quantised)) * 4 if cfg.load_in_4bit else params * b
    trainable_bytes = 4 if cfg.load_in_4bit else b
    reference = 0
    if cfg.beta > 0 and cfg.lora.r == 0:
        in_bf16 = untied if mixed and not cfg.ref_model_sync_steps else 0
        in_bf16 = params if cfg.ref_model_dtype == "bfloat16" else in_bf16
        reference = in_bf16 * 2 + (params - in_bf16) * b
    sizes = trainable_sizes(model, cfg)
    trainable = sum(sizes)
    eight_bit = cfg.optimizer in EIGHT_BIT_OPTIMIZERS
    largest_8bit = min(max((n for n in sizes if n >= EIGHT_BIT_MIN_SIZE), default=0), EIGHT_BIT_SLICE)

    h, layers, heads = config.hidden_size, config.num_hidden_layers, config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or h // heads
    T, P, G = cfg.max_completion_length, cfg.max_prompt_length or 0, cfg.num_generations
    context = P + T
    rows = cfg.completions_per_step()  # a step's completions (one process's), sampled together
    kv_cache = rows * context * layers * 2 * kv_heads * head_dim * (4 if mixed or sampling == 2 else b)
    fused = getattr(config, "model_type", None) in FUSED_DECODER_TYPES and not cfg.load_in_4bit

    def saved_activations(rows: int) -> int:
        """What a forward pass over ``rows`` completions keeps for its backward."""
        per_token = activation_bytes_per_token(cfg, config, device, compute, rows)
        if cfg.gradient_checkpointing:  # full rows (no shared prefix): each layer's input, plus one layer recomputed
            return rows * context * (layers * h * b + per_token)
        return (rows * T + -(-rows // G) * P) * layers * per_token  # each group's prompt once (shared prefix)

    per_device = cfg.per_device_train_batch_size
    mb = min(cfg.backward_chunk_rows or per_device, per_device)  # rows per forward and backward pass
    activations = saved_activations(mb)
    logits = mb * T * config.vocab_size * compute
    kept_logits = logits if logits <= SAVED_LOGITS_BYTES else 0
    # every Linear's bf16 weight is saved for the backward (frozen ones too: the input's gradient needs it), LoRA's
    # adapters besides
    casts = (linear - sum(quantised) + (trainable if cfg.lora.r > 0 else 0)) * 2 if mixed else 0
    head_chunks = 2 * min(CHUNK_ELEMENTS, mb * T * config.vocab_size) * 4  # two float32 chunks of logits at a time
    micro_batch = activations + kept_logits + head_chunks + casts

    return MemoryEstimate(
        parameters=params,
        trainable=trainable,
        weights=weights,
        reference=reference,
        gradients=trainable * trainable_bytes,
        adamw=adamw_bytes(sizes, trainable_bytes, eight_bit),
        micro_batch=micro_batch,
        generation=kv_cache + (linear * sampling if fused else 0),
        optimizer_step=5 * 4 * largest_8bit if eight_bit and device.type == "cpu" else 0,
        backward_chunk_rows=mb,
        parts={
            "activations": activations,
            "kept_logits": kept_logits,
            "head_chunks": head_chunks,
            "weight_casts": casts,
            "kv_cache": kv_cache,
            "decoder_weights": linear * compute if fused else 0,
        },
    )


def activation_bytes_per_token(cfg: GRPOConfig, config, device: torch.device, compute: int, rows: int) -> int:
    """Bytes one token saves for the backward in one decoder layer (the module docstring's a): 33 h + 7 i under
    bf16 autocast, 39 h + 14 i in one dtype, 8 i less where the lean MLP keeps gate and up only
    (:func:`lean_mlp_applies`), plus the attention probabilities grpokit's plain CPU attention keeps for small
    calls of ``rows`` rows (SDPA keeps none)."""
    h, i = config.hidden_size, getattr(config, "intermediate_size", None) or 4 * config.hidden_size
    heads = config.num_attention_heads
    T, context = cfg.max_completion_length, (cfg.max_prompt_length or 0) + cfg.max_completion_length
    plain = device.type == "cpu" and not cfg.gradient_checkpointing and rows * heads * T * context * 4 <= PROBS_BUDGET
    probs = heads * context * (6 if compute == 2 else 4) * plain
    if compute == 2:
        return 33 * h + 7 * i + probs
    return 39 * h + (6 if lean_mlp_applies(cfg, config) else 14) * i + probs


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

    def fits(rows: int) -> bool:
        with warnings.catch_warnings():  # the config's warnings were given when it was built
            warnings.simplefilter("ignore")
            estimate = estimate_memory(cfg.replace(backward_chunk_rows=rows), meta, device)
        return process_bytes(estimate, device) <= free

    return backward_chunk_rows(cfg, fits)


# What a CPU training process holds beyond its tensors (runtime, allocator): 0.5-0.8 GiB in bench/memory_estimate.py;
# the warning counts the low end, so it errs toward staying quiet.
PROCESS_OVERHEAD = 2**29


def available_bytes(device: torch.device) -> int | None:
    """Memory free for a new process on ``device``: the GPU's free memory, or the host's MemAvailable (Linux); else
    None."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    if device.type != "cpu":
        return None
    try:
        with open("/proc/meminfo") as f:
            fields = dict(line.split(":", 1) for line in f)
        return int(fields["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        return None


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


def process_bytes(estimate: MemoryEstimate, device: torch.device) -> int:
    """One training process's need: the tensors' peak, plus the process itself on CPU (:data:`PROCESS_OVERHEAD`)."""
    return estimate.peak + (PROCESS_OVERHEAD if device.type == "cpu" else 0)


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
