"""One decoding step of a Llama-family model with fused projections, for the rollout engine.

A decoding step multiplies a few rows (the sequences still running) by every weight of the model,
so its cost is per-call overhead and weight traffic, not FLOPs. Through the Hugging Face modules a
layer makes seven matmul calls (q, k, v, o, gate, up, down), each casting its input under
autocast, plus ~25 small ops for norms and rotary embeddings. :class:`FusedDecoder` runs the same
layer from weights prepared once per generation: q/k/v in one matrix, gate/up in one matrix, all
in the compute dtype (the values autocast would use) and, on CPUs that support it, packed for
oneDNN (:mod:`grpokit.kernels.packed_linear`): four matmuls per layer. Norms (the model's own modules),
rotary embeddings (its own rotary module) and the KV cache (:mod:`grpokit.kernels.kv_cache`) are
the same as in the HF forward, in the same dtypes; attention of the single new token is two small
float32 matmuls (:func:`_decode_attention`).

Architectures: Llama, Qwen2, Qwen3 (q/k norms) and Mistral, i.e. pre-norm decoders with RMSNorm,
SiLU-gated MLP, rotary embeddings and no sliding window in effect; the prefill stays on the HF
forward. :func:`fused_decoder` builds one only after checking that its logits match the HF
forward's on a short sequence (float32, 1e-4), so a variant with some other twist falls back to the
HF forward instead of decoding wrongly. With LoRA (peft), each adapted layer's weight is its base
weight plus the active adapters' B A x scaling (merged for the copy, as vLLM does); DoRA and other
variants, quantised or sharded weights and custom models are not fused. It is a CPU kernel: a model on any other
device decodes through its own forward (SDPA).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from grpokit.kernels.kv_cache import PreallocatedLayer, preallocate
from grpokit.kernels.packed_linear import pack
from grpokit.models.kv_cache_arg import output_cache
from grpokit.models.loading import is_hf_model

SUPPORTED = ("llama", "qwen2", "qwen3", "mistral")


def _weight_and_bias(linear: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """The (weight, bias) a layer computes with: a plain ``nn.Linear``'s own, or for a peft LoRA Linear
    its base weight plus the deltas of its active adapters (B A x scaling); None for anything else."""
    if type(linear) is torch.nn.Linear:
        return linear.weight, linear.bias
    base = getattr(linear, "base_layer", None)
    if (
        type(base) is not torch.nn.Linear
        or not hasattr(linear, "get_delta_weight")
        or getattr(linear, "lora_variant", None)
    ):
        return None  # not LoRA, or a variant (DoRA, ...) that is not a plain weight delta
    weight = base.weight
    if not linear.disable_adapters and not linear.merged:
        for name in linear.active_adapters:
            if name in linear.lora_A:
                weight = weight + linear.get_delta_weight(name)
    return weight, base.bias


def _fused_linear(
    layers: list[torch.nn.Module], dtype: torch.dtype, rows: int
) -> Callable[[torch.Tensor], torch.Tensor]:
    """x -> x W^T + b for the effective weights of ``layers`` stacked (:func:`_weight_and_bias`), in
    ``dtype``: packed for oneDNN where this CPU supports it (:func:`grpokit.kernels.packed_linear.pack`),
    else ``F.linear``."""
    weights, biases = zip(*(_weight_and_bias(layer) for layer in layers))
    # [out, in]; a single weight is packed from where it is (oneDNN's reorder copies it; a cat would copy it twice)
    weight = (weights[0].detach() if len(weights) == 1 else torch.cat([w.detach() for w in weights])).to(dtype)
    bias = (
        None
        if all(b is None for b in biases)
        else torch.cat([b.detach() if b is not None else w.new_zeros(w.size(0)) for w, b in zip(weights, biases)]).to(
            dtype
        )
    )
    packed = pack(weight, bias, dtype, rows) if dtype in (torch.float32, torch.bfloat16) else None
    return packed if packed is not None else (lambda x: F.linear(x.to(dtype), weight, bias))


@dataclass
class _Layer:
    attn: torch.nn.Module  # the HF attention module (its norms, scaling and config are reused)
    input_norm: torch.nn.Module
    post_norm: torch.nn.Module
    qkv: Callable[[torch.Tensor], torch.Tensor]
    o: Callable[[torch.Tensor], torch.Tensor]
    gate_up: Callable[[torch.Tensor], torch.Tensor]
    down: Callable[[torch.Tensor], torch.Tensor]
    split: tuple[int, int, int]  # q, k, v widths


def _decode_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scaling: float
) -> torch.Tensor:
    """Attention of one query token per row, float32: q [A, heads, 1, d], k/v [A, kv_heads, L, d],
    mask [A, 1, 1, L] (True = attend) or None -> [A, 1, heads * d].

    The query heads of a group share their key/value head, so they are stacked as that head's query
    rows ([A, kv_heads, group, d]): two small batched matmuls, no repeated K/V. At decoding sizes
    (tens of rows, a few hundred keys) this is faster than SDPA's CPU kernel, which is built for long
    queries (docs/performance.md).
    """
    rows, heads, _, d = q.shape
    kv_heads = k.size(1)
    with torch.autocast(q.device.type, enabled=False):
        q = q.reshape(rows, kv_heads, heads // kv_heads, d).float()  # [A, kv, g, d]
        scores = torch.matmul(q, k.float().transpose(-1, -2)).mul_(scaling)  # [A, kv, g, L]
        if mask is not None:
            scores.masked_fill_(~mask, float("-inf"))  # every row attends at least to its own new token
        out = torch.matmul(torch.softmax(scores, dim=-1), v.float())  # [A, kv, g, d]
    return out.reshape(rows, 1, heads * d)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class FusedDecoder:
    """Decoding steps of ``model`` (a supported HF causal LM) from fused copies of its weights.

    Built per generation (the weights change between generations); ``rows`` is the expected rows
    per step (for oneDNN's packing; any count works).
    """

    def __init__(self, model: torch.nn.Module, dtype: torch.dtype, rows: int):
        hf = _hf_model(model)
        self.base = hf.model
        self.layers = []
        for layer in self.base.layers:
            a, m = layer.self_attn, layer.mlp
            self.layers.append(
                _Layer(
                    attn=a,
                    input_norm=layer.input_layernorm,
                    post_norm=layer.post_attention_layernorm,
                    qkv=_fused_linear([a.q_proj, a.k_proj, a.v_proj], dtype, rows),
                    o=_fused_linear([a.o_proj], dtype, rows),
                    gate_up=_fused_linear([m.gate_proj, m.up_proj], dtype, rows),
                    down=_fused_linear([m.down_proj], dtype, rows),
                    split=(a.q_proj.out_features, a.k_proj.out_features, a.v_proj.out_features),
                )
            )
        self.head = _fused_linear([hf.get_output_embeddings()], dtype, rows)

    def step(self, tokens: torch.Tensor, position: torch.Tensor, mask: torch.Tensor | None, cache) -> torch.Tensor:
        """Next-token logits [A, V] for ``tokens`` [A] at ``position`` [A, 1], attending under ``mask``
        (SDPA format, [A, 1, 1, L] boolean, True = attend, or None) to ``cache`` (one
        :class:`PreallocatedLayer` per layer), which receives the tokens' keys and values."""
        x = self.base.embed_tokens(tokens[:, None])  # [A, 1, H]
        cos, sin = self.base.rotary_emb(x, position)  # [A, 1, d]
        cos, sin = cos[:, None], sin[:, None]  # [A, 1, 1, d]: broadcast over heads
        rows = x.size(0)
        for i, layer in enumerate(self.layers):
            a = layer.attn
            q, k, v = layer.qkv(layer.input_norm(x)).split(layer.split, dim=-1)  # [A, 1, heads * d]
            q, k, v = (t.view(rows, 1, -1, a.head_dim) for t in (q, k, v))  # [A, 1, heads, d]
            if hasattr(a, "q_norm"):  # Qwen3: RMSNorm over the head dimension
                q, k = a.q_norm(q), a.k_norm(k)
            q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # [A, heads, 1, d]
            q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
            k, v = cache.layers[i].update(k, v)
            x = x + layer.o(_decode_attention(q, k, v, mask, a.scaling))
            gate, up = layer.gate_up(layer.post_norm(x)).chunk(2, dim=-1)
            x = x + layer.down(F.silu(gate) * up)
        return self.head(self.base.norm(x))[:, -1]  # [A, V]


def _hf_model(model: torch.nn.Module) -> torch.nn.Module:
    """The transformers model itself (inside a peft wrapper)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def _fusable(model: torch.nn.Module) -> bool:
    """Structure check: a supported architecture whose parts are the modules the step reads."""
    if not is_hf_model(model):
        return False
    hf = _hf_model(model)
    config = hf.config
    if getattr(config, "model_type", None) not in SUPPORTED:
        return False
    base = getattr(hf, "model", None)
    if base is None or not all(hasattr(base, n) for n in ("embed_tokens", "layers", "norm", "rotary_emb")):
        return False
    if getattr(config, "hidden_act", None) != "silu" or getattr(config, "_attn_implementation", None) != "sdpa":
        return False
    if any(t != "full_attention" for t in getattr(config, "layer_types", None) or []) or getattr(
        config, "sliding_window", None
    ):
        return False  # sliding-window layers (Mistral's window, Qwen's use_sliding_window) attend differently
    linears = [hf.get_output_embeddings()]
    for layer in base.layers:
        a, m = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
        try:
            linears += [a.q_proj, a.k_proj, a.v_proj, a.o_proj, m.gate_proj, m.up_proj, m.down_proj]
        except AttributeError:
            return False
    found = [_weight_and_bias(linear) for linear in linears]
    return all(wb is not None and type(wb[0].data) is torch.Tensor for wb in found)  # not quantised, not sharded


def _matches_hf(model: torch.nn.Module) -> bool:
    """Whether a fused step gives the HF forward's logits (float32, 1e-4) on a 5-token sequence."""
    device = next(model.parameters()).device
    ids = (torch.arange(3, 8, device=device) % _hf_model(model).config.vocab_size)[None]  # [1, 5]
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), torch.autocast(device.type, enabled=False):
            expected = model(input_ids=ids).logits[:, -1].float()  # [1, V]
            prefix = model(input_ids=ids[:, :4], use_cache=True)
            cache = output_cache(prefix)
            preallocate(cache, 5)
            if not all(isinstance(layer, PreallocatedLayer) for layer in cache.layers):
                return False
            decoder = FusedDecoder(model, torch.float32, 1)
            got = decoder.step(ids[:, 4], torch.tensor([[4]], device=device), None, cache).float()
    finally:
        model.train(was_training)
    return bool(torch.allclose(got, expected, rtol=1e-4, atol=1e-4))


def fused_decoder(
    model: torch.nn.Module, dtype: torch.dtype, rows: int, checked: weakref.WeakKeyDictionary | None = None
) -> FusedDecoder | None:
    """A :class:`FusedDecoder` for ``model`` computing in ``dtype``, or None when the model is not
    supported (see the module docstring) or fails the check against its HF forward. ``checked``
    (model -> passed) keeps each model's result, so the check runs once per model and run. CPU only: on a GPU the
    weight copies and float32 attention over the whole cache cost more than the HF forward with SDPA."""
    if next(model.parameters()).device.type != "cpu" or not _fusable(model):
        return None
    if checked is None:
        return FusedDecoder(model, dtype, rows) if _matches_hf(model) else None
    if model not in checked:
        checked[model] = _matches_hf(model)
    return FusedDecoder(model, dtype, rows) if checked[model] else None
