"""The lean MLP: the learner's gradients bitwise those of the HF MLP, fewer saved bytes, and the module's own
forward wherever it does not apply."""

import copy
import dataclasses

import pytest
import torch

from grpokit.kernels import Kernels
from grpokit.kernels.lean_mlp import lean_mlps
from grpokit.train.learning.policy_logprobs import Batch, completion_logprobs

CPU = torch.device("cpu")

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: see conftest.one_thread


def tiny(arch: str, **overrides):
    from transformers import AutoModelForCausalLM, LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config

    cls = {"llama": LlamaConfig, "qwen2": Qwen2Config, "qwen3": Qwen3Config, "mistral": MistralConfig}[arch]
    config = cls(
        vocab_size=53,
        hidden_size=32,
        intermediate_size=80,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        pad_token_id=0,
        **overrides,
    )
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").train()


def batch() -> Batch:
    g = torch.Generator().manual_seed(1)
    completions = torch.randint(1, 53, (4, 6), generator=g)
    mask = torch.ones(4, 6)
    mask[1, 4:] = 0  # a shorter completion
    prompts = torch.randint(1, 53, (2, 5), generator=g)
    return Batch(
        completion_ids=completions,
        completion_mask=mask,
        group_index=torch.tensor([0, 0, 1, 1]),
        prompt_ids=prompts,
        prompt_mask=torch.ones_like(prompts),
    )


def learner_pass(model, kernels) -> tuple[dict[str, torch.Tensor], int]:
    """The learner's forward (completion_logprobs with entropy) and the backward of a GRPO-shaped loss:
    (gradients, bytes of the activations saved for the backward, parameters excluded)."""
    model.zero_grad(set_to_none=True)
    params = {p.data_ptr() for p in model.parameters()}
    saved: dict[int, int] = {}

    def pack(t):
        if t.data_ptr() not in params:
            saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    b = batch()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        logprobs, entropy = completion_logprobs(model, b, 0.9, with_entropy=True, kernels=kernels)
    advantages = torch.tensor([1.0, -0.5, 0.25, -1.0])
    (-(logprobs * advantages[:, None] * b.completion_mask).sum() + 0.1 * entropy.sum()).backward()
    return {n: p.grad.to_dense() for n, p in model.named_parameters() if p.grad is not None}, sum(saved.values())


def bytes_spared_with_bitwise_gradients(arch: str, flag: str) -> int:
    """The learner pass of a tiny ``arch`` model with the kernel ``flag`` on (as selected for CPU) and off: asserts the
    gradients are bitwise equal, returns the saved bytes the kernel spares."""
    model = tiny(arch)
    lean = Kernels.select(CPU, None)
    assert getattr(lean, flag)
    expected, plain_bytes = learner_pass(model, dataclasses.replace(lean, **{flag: False}))
    got, lean_bytes = learner_pass(model, lean)
    assert expected.keys() == got.keys()
    for name in expected:
        assert torch.equal(got[name], expected[name]), name
    return plain_bytes - lean_bytes


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "mistral"])
def test_gradients_are_bitwise_the_modules_with_less_saved(arch):
    spared = bytes_spared_with_bitwise_gradients(arch, "lean_mlp")
    # per token and layer the module keeps gate, silu(gate), up and their product (4 x 80 floats), the lean MLP
    # gate and up: 2 x 80 x 4 B less per token and layer. Tokens run: the 2 prompts' 5 once each, then each
    # completion's first 5 of 6 (the last one predicts nothing; the padded row runs as wide): 10 + 20 = 30
    tokens, layers = 2 * 5 + 4 * 5, 2
    assert spared == tokens * layers * 2 * 80 * 4


def test_only_supported_float32_recorded_calls_take_it():
    model = tiny("qwen2")
    x = torch.randn(2, 3, 32, requires_grad=True)
    mlp = model.model.layers[0].mlp
    with lean_mlps(model) as switched:
        assert switched == 2
        assert type(mlp(x).grad_fn).__name__ == "LeanMLPBackward"
        with torch.no_grad():
            assert mlp(x).grad_fn is None
        with torch.autocast("cpu", dtype=torch.bfloat16):  # autocast's casts stay autocast's: the module runs
            assert type(mlp(x).grad_fn).__name__ != "LeanMLPBackward"
    assert "forward" not in vars(mlp)  # restored
    assert type(mlp(x).grad_fn).__name__ != "LeanMLPBackward"


def test_frozen_weights_get_no_gradient_and_the_input_gets_its_own():
    model = tiny("llama")
    mlp = model.model.layers[0].mlp
    for p in mlp.parameters():
        p.requires_grad_(False)
    x = torch.randn(2, 3, 32, requires_grad=True)
    expected = torch.autograd.grad(mlp(x).sum(), x)[0]
    with lean_mlps(model):
        out = mlp(x)
        assert type(out.grad_fn).__name__ == "LeanMLPBackward"
    assert torch.equal(torch.autograd.grad(out.sum(), x)[0], expected)
    assert all(p.grad is None for p in mlp.parameters())


def test_left_alone_where_it_does_not_apply():
    import peft

    model = tiny("qwen2")
    lora = peft.get_peft_model(copy.deepcopy(model), peft.LoraConfig(r=2, target_modules=["up_proj"]))
    with lean_mlps(lora) as switched:  # every MLP has a LoRA layer
        assert switched == 0
    attention_only = peft.get_peft_model(copy.deepcopy(model), peft.LoraConfig(r=2, target_modules=["q_proj"]))
    with lean_mlps(attention_only) as switched:  # frozen plain MLPs: saved activations matter there too
        assert switched == 2
    biased = tiny("llama", mlp_bias=True)
    with lean_mlps(biased) as switched:
        assert switched == 0
    gelu = tiny("llama", hidden_act="gelu")
    with lean_mlps(gelu) as switched:
        assert switched == 0
    checkpointed = tiny("qwen2")
    checkpointed.gradient_checkpointing_enable()
    with lean_mlps(checkpointed) as switched:  # its recompute runs after the block
        assert switched == 0
    half = tiny("qwen2").to(torch.bfloat16)
    with lean_mlps(half) as switched:
        assert switched == 0
