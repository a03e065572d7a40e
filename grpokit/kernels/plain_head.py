"""Whether a model's logits are a plain Linear head over its decoder, so the fused LM head may compute them."""

from __future__ import annotations

import weakref

import torch
import torch.nn.functional as F

from grpokit.models.loading import is_hf_model, logits_of
from grpokit.models.vision import decoder_of


def plain_head(
    model: torch.nn.Module, checked: weakref.WeakKeyDictionary | None = None
) -> tuple[torch.nn.Module, torch.nn.Linear] | None:
    """(decoder, lm_head) when ``model``'s logits are exactly ``lm_head(decoder(...).last_hidden_state)``,
    else None (custom models, non-Linear heads, and architectures that scale or soft-cap their logits).

    ``model``: an HF model or a peft wrapper of one, called directly (the caller rules out DDP and FSDP,
    whose forward must run as a whole). Decided by comparing both on a 4-token input, so an architecture
    that post-processes its logits in a way not listed anywhere still takes the exact logits path;
    ``checked`` (base model -> answer) keeps each model's answer, so the check runs once per model.
    """
    if not is_hf_model(model):
        return None
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if checked is None:
        return _check_plain_head(model, base)
    if base not in checked:
        checked[base] = _check_plain_head(model, base)
    return checked[base]


def _check_plain_head(model: torch.nn.Module, base: torch.nn.Module):
    head = base.get_output_embeddings()
    decoder = decoder_of(base)  # a vision-language model's takes its pixel inputs too
    if type(head) is not torch.nn.Linear or decoder is None or decoder is base:
        return None
    ids = (torch.arange(1, 5, device=head.weight.device) % head.weight.size(0))[None]  # [1, 4]
    was_training = base.training
    base.eval()  # no dropout, so both computations see the same network
    try:
        with torch.no_grad():  # in the caller's autocast state: both sides run the same ops
            expected = logits_of(model(input_ids=ids)).float()
            hidden = decoder(input_ids=ids).last_hidden_state
            dtype = torch.promote_types(hidden.dtype, head.weight.dtype)  # as the fused head computes
            bias = None if head.bias is None else head.bias.to(dtype)
            got = F.linear(hidden.to(dtype), head.weight.to(dtype), bias).float()
    finally:
        base.train(was_training)
    return (
        (decoder, head) if got.shape == expected.shape and torch.allclose(got, expected, rtol=1e-4, atol=1e-4) else None
    )
