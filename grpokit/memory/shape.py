"""A causal LM's sizes for the memory estimate, read from its architecture on the meta device (no weights read)."""

from __future__ import annotations

import copy

import torch

from grpokit.kernels.linear_storage import untied_linears
from grpokit.memory.estimate import ModelShape
from grpokit.models.loading import lora_config, model_config
from grpokit.models.lora_settings import LoraSettings


def build_meta_model(name_or_path: str, trust_remote_code: bool = False) -> torch.nn.Module:
    """A HF causal LM's architecture (local folder or hub id) on the meta device: shapes, no weights."""
    from transformers import AutoModelForCausalLM

    config = model_config(name_or_path, trust_remote_code)
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)


def four_bit_linears(model: torch.nn.Module) -> list[torch.nn.Linear]:
    """The Linear layers ``load_in_4bit`` quantises: all but the LM head (transformers leaves it unquantised)."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    return [m for m in model.modules() if isinstance(m, torch.nn.Linear) and m is not head]


def trainable_sizes(model: torch.nn.Module, lora: LoraSettings) -> tuple[int, ...]:
    """The size of each parameter training updates: every one of ``model`` (a meta-device model), or the LoRA
    adapters training would add to it (counted on a copy; ``model`` is left as it is)."""
    if lora.r == 0:
        return tuple(p.numel() for p in model.parameters())
    from peft import get_peft_model

    wrapped = get_peft_model(copy.deepcopy(model), lora_config(lora))
    return tuple(p.numel() for p in wrapped.parameters() if p.requires_grad)


def model_shape(model: torch.nn.Module) -> ModelShape:
    """``model``'s (a meta-device causal LM) parameter counts and the config's sizes the estimate reads."""
    config = model.config
    heads = config.num_attention_heads
    return ModelShape(
        parameters=sum(p.numel() for p in model.parameters()),
        untied_linear=sum(p.numel() for m in untied_linears(model) for p in m.parameters(recurse=False)),
        linear=sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear)),
        four_bit_linears=tuple(m.weight.numel() for m in four_bit_linears(model)),
        hidden_size=config.hidden_size,
        intermediate_size=getattr(config, "intermediate_size", None) or 4 * config.hidden_size,
        layers=config.num_hidden_layers,
        heads=heads,
        kv_heads=getattr(config, "num_key_value_heads", None) or heads,
        head_dim=getattr(config, "head_dim", None) or config.hidden_size // heads,
        vocab_size=config.vocab_size,
        model_type=getattr(config, "model_type", None),
    )
