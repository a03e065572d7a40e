"""LoRA target_modules in every form peft takes (a list, a string, None = peft's default for the architecture), and
the memory estimate's lean-MLP rule on each (None crashed it: TypeError, 'NoneType' is not iterable)."""

from __future__ import annotations

import pytest
from transformers import GPT2Config, LlamaConfig

from grpokit.compose.memory import lean_mlp_applies
from grpokit.config import GRPOConfig
from grpokit.models.lora_targets import ANY_LINEAR, adapts_any, target_names

pytest.importorskip("peft")

MLP = ("gate_proj", "up_proj", "down_proj")


def test_target_names_in_every_form():
    # peft's table: Llama and Qwen2 adapt q_proj and v_proj when target_modules is None
    assert target_names(None, "llama") == {"q_proj", "v_proj"} == target_names(None, "qwen2")
    assert target_names(["q_proj", "down_proj"], "llama") == {"q_proj", "down_proj"}
    assert target_names({"k_proj"}, "llama") == {"k_proj"}
    assert target_names("all-linear", "llama") is ANY_LINEAR  # a string may name any Linear
    assert target_names(".*mlp.*", "llama") is ANY_LINEAR
    assert target_names(None, "no-such-architecture") is ANY_LINEAR  # peft has no default: assume any


def test_adapts_any():
    assert not adapts_any(None, "llama", MLP)
    assert adapts_any(["q_proj", "model.layers.0.mlp.down_proj"], "llama", MLP)  # a dotted path ends in the name
    assert not adapts_any(["q_proj", "o_proj"], "llama", MLP)
    assert adapts_any("all-linear", "llama", MLP)


def _llama():
    return LlamaConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2)


@pytest.mark.parametrize(
    ("targets", "lean"),
    [(None, True), (["q_proj", "v_proj"], True), (["q_proj", "up_proj"], False), ("all-linear", False)],
)
def test_lean_mlp_rule_for_each_form(targets, lean):
    cfg = GRPOConfig(model_name_or_path="x", lora={"r": 4, "target_modules": targets})
    assert lean_mlp_applies(cfg, _llama()) is lean


def test_lean_mlp_rule_off_the_llama_family():
    cfg = GRPOConfig(model_name_or_path="x", lora={"r": 4, "target_modules": None})
    assert lean_mlp_applies(cfg, GPT2Config(n_embd=16, n_layer=1, n_head=2)) is False
