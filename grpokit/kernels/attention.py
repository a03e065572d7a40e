"""A plain matmul-softmax-matmul attention for the learner's small CPU passes, under transformers' attention interface.

At small shapes on CPU (a micro-batch of a few rows x tens of completion tokens), torch's fused CPU
flash-attention kernel costs more than three plain ops, above all in backward. The plain form keeps
the [batch, heads, q_len, k_len] probabilities for backward, which grow quadratically, so it is used
only while that tensor is small (``PROBS_BUDGET``; ``NO_GRAD_PROBS_BUDGET`` in forward-only passes,
where SDPA's forward is harder to beat); every other call (other devices, dropout, bigger problems,
features it does not implement) goes to SDPA: on CPU through :func:`gqa_sdpa`, torch's SDPA with its own
grouped-query attention (K/V not repeated per query head), elsewhere through transformers' own SDPA
function with the same arguments. :func:`small_attention` switches a model from "sdpa" to it for a
block. docs/performance.md has the per-call measurements the budgets come from.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from grpokit.models.loading import activation_checkpointing

NAME = "grpokit_small_sdpa"
# Bytes of the [batch, heads, q_len, k_len] probabilities (compute dtype) up to which the plain form runs, when
# autograd records the call and in forward-only passes: the sizes where it clearly beats SDPA (docs/performance.md).
PROBS_BUDGET = 4 * 2**20
NO_GRAD_PROBS_BUDGET = 2 * 2**20
# Arguments the plain form does not implement: such calls go to SDPA (which raises or handles them as HF does).
_SDPA_ONLY = ("softcap", "s_aux", "position_bias", "cache")


def small_attention_forward(
    module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kwargs
):
    """HF attention-function contract: query [b, h, q, d], key/value [b, kv, k, d] -> ([b, q, h, d], None).

    ``attention_mask`` comes in SDPA's format (made by ``sdpa_mask``): boolean [b or 1, 1, q, k],
    True = attend, or None for plain causal (or no) masking, with SDPA's upper-left causal alignment.
    """
    b, heads, q_len, d = query.shape
    kv_heads, k_len = key.shape[1], key.shape[2]
    mask = attention_mask
    recorded = torch.is_grad_enabled() and (query.requires_grad or key.requires_grad or value.requires_grad)
    budget = PROBS_BUDGET if recorded else NO_GRAD_PROBS_BUDGET
    if (
        query.device.type != "cpu"
        or any(kwargs.get(k) is not None for k in _SDPA_ONLY)
        or kwargs.get("output_attentions")
    ):
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal, **kwargs
        )
    if (
        dropout
        or (mask is not None and (mask.dtype != torch.bool or mask.shape[1] != 1))
        or b * heads * q_len * k_len * query.element_size() > budget
    ):
        return gqa_sdpa(module, query, key, value, attention_mask, dropout, scaling, is_causal)
    groups = heads // kv_heads
    scale = d**-0.5 if scaling is None else scaling
    # Head h uses KV head h // groups (repeat_kv's order): fold the groups into the query length, K/V stay unrepeated.
    scores = torch.baddbmm(
        query.new_zeros(()),
        query.reshape(b * kv_heads, groups * q_len, d),
        key.reshape(b * kv_heads, k_len, d).transpose(1, 2),
        beta=0,
        alpha=scale,
    )  # [b*kv, g*q, k]
    scores = scores.view(b, kv_heads, groups, q_len, k_len)
    if mask is not None:
        mask = mask[:, :, None]  # [b, 1, 1, q, k]: the same for every head
    elif q_len > 1 and (is_causal if is_causal is not None else getattr(module, "is_causal", True)):
        mask = torch.ones(
            q_len, k_len, dtype=torch.bool, device=query.device
        ).tril()  # SDPA's is_causal: key j <= query i
    if mask is not None:
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32)
    if mask is not None and not bool(mask.any(-1).all()):
        probs = probs.masked_fill(
            ~mask, 0.0
        )  # rows with every key masked (left padding) give 0 as in SDPA, not a uniform mix
    out = torch.matmul(probs.to(value.dtype).view(b, kv_heads, groups * q_len, k_len), value)  # [b, kv, g*q, d]
    return out.view(b, heads, q_len, d).transpose(1, 2).contiguous(), None


def gqa_sdpa(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None):
    """transformers' SDPA call (its causal flag, its key crop) with torch's own grouped-query attention: key and value
    [b, kv, k, d] go in as they are, where transformers repeats them to [b, heads, k, d] whenever there is a mask.
    The backward then keeps the unrepeated K and V (at Qwen2.5-0.5B 2 heads' instead of 14: 0.4 GB less for a
    micro-batch of 32 x 64 tokens), and the forward copies nothing. Same output; the K/V gradients sum a group's
    heads inside the kernel, so they differ from repeat_kv's by float rounding."""
    q_len = query.shape[2]
    causal = (
        q_len > 1
        and attention_mask is None
        and (is_causal if is_causal is not None else getattr(module, "is_causal", True))
    )
    if causal and key.shape[2] > q_len:  # as transformers: SDPA's causal mask is aligned upper-left
        key, value = key[:, :, :q_len], value[:, :, :q_len]
    out = F.scaled_dot_product_attention(
        query,
        key,
        value,
        attn_mask=attention_mask,
        dropout_p=dropout,
        scale=scaling,
        is_causal=causal,
        enable_gqa=query.shape[1] != key.shape[1],
    )  # [b, heads, q, d]
    return out.transpose(1, 2).contiguous(), None


AttentionInterface.register(NAME, small_attention_forward)
AttentionMaskInterface.register(NAME, sdpa_mask)


@contextlib.contextmanager
def small_attention(model: torch.nn.Module):
    """Run ``model``'s attention through :func:`small_attention_forward` while inside, if it uses "sdpa".

    ``model``: an HF model, a peft wrapper of one, or either inside DDP (FSDP2 modules are the model
    itself). Models on any other implementation (eager, flash attention, custom modules) are left
    alone, and so are models with activation checkpointing: they rerun the forward in backward, after
    the block, and torch checks that the rerun saves the same tensors. Otherwise autograd replays the
    ops each call recorded, so a backward after the block needs nothing from it.
    """
    model = model.module if isinstance(model, DistributedDataParallel) else model
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    config = getattr(base, "config", None)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    # a VLM's language model may keep its own implementation (PaliGemma 2's Gemma 2: eager, for its logit softcap),
    # which setting the outer config's would overwrite
    uses = {getattr(config, "_attn_implementation", None), getattr(text, "_attn_implementation", None)}
    if uses != {"sdpa"} or activation_checkpointing(base):
        yield
        return
    config._attn_implementation = NAME
    try:
        yield
    finally:
        config._attn_implementation = "sdpa"
