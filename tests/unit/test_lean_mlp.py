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
    """The learner's forward (completion_logprobs with entropy; under CPU autocast to ``kernels.autocast_dtype`` when
    set, as the learner runs it) and the backward of a GRPO-shaped loss: (gradients, bytes of what the forward saved
    for the backward, parameters excluded: activations, and under autocast the weights' casts)."""
    model.zero_grad(set_to_none=True)
    params = {p.data_ptr() for p in model.parameters()}
    saved: dict[int, int] = {}

    def pack(t):
        if t.data_ptr() not in params:
            saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    b = batch()
    autocast = torch.autocast("cpu", dtype=kernels.autocast_dtype, enabled=kernels.autocast_dtype is not None)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), autocast:
        logprobs, entropy = completion_logprobs(model, b, 0.9, with_entropy=True, kernels=kernels)
    advantages = torch.tensor([1.0, -0.5, 0.25, -1.0])
    (-(logprobs * advantages[:, None] * b.completion_mask).sum() + 0.1 * entropy.sum()).backward()
    return {n: p.grad.to_dense() for n, p in model.named_parameters() if p.grad is not None}, sum(saved.values())


def bytes_spared_with_bitwise_gradients(arch: str, flag: str, autocast_dtype: torch.dtype | None = None) -> int:
    """The learner pass of a tiny ``arch`` model with the kernel ``flag`` on (as selected for CPU, under autocast to
    ``autocast_dtype`` when given) and off: asserts the gradients are bitwise equal (under autocast: equal within the
    autocast dtype's rounding, ``assert_close_in``), returns the saved bytes the kernel spares."""
    model = tiny(arch)
    lean = Kernels.select(CPU, autocast_dtype)
    assert getattr(lean, flag)
    expected, plain_bytes = learner_pass(model, dataclasses.replace(lean, **{flag: False}))
    got, lean_bytes = learner_pass(model, lean)
    assert expected.keys() == got.keys()
    for name in expected:
        if autocast_dtype is None:
            assert torch.equal(got[name], expected[name]), name
        else:
            assert_close_in(autocast_dtype, got[name], expected[name], name)
    return plain_bytes - lean_bytes


def assert_close_in(dtype: torch.dtype, got: torch.Tensor, expected: torch.Tensor, name: str = "") -> None:
    """``got`` equal to ``expected`` within a few roundings to ``dtype``: 4 units in the last place of ``dtype`` (bf16:
    2**-6 relative), against each value and against the tensor's largest (gradients that cancel to near 0)."""
    eps = 4 * torch.finfo(dtype).eps
    torch.testing.assert_close(got, expected, rtol=eps, atol=eps * float(expected.abs().max()), msg=name or None)


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "mistral"])
def test_gradients_are_bitwise_the_modules_with_less_saved(arch):
    spared = bytes_spared_with_bitwise_gradients(arch, "lean_mlp")
    # per token and layer the module keeps gate, silu(gate), up and their product (4 x 80 floats), the lean MLP
    # gate and up: 2 x 80 x 4 B less per token and layer. Tokens run: the 2 prompts' 5 once each, then each
    # completion's first 5 of 6 (the last one predicts nothing; the padded row runs as wide): 10 + 20 = 30
    tokens, layers = 2 * 5 + 4 * 5, 2
    assert spared == tokens * layers * 2 * 80 * 4


def test_under_cpu_autocast_gradients_are_the_modules_within_bf16_without_the_casts():
    # not bitwise: the module sums a weight's bf16 gradients of the prompt's and the completions' calls in bf16 (one
    # cached cast), the lean MLP each call's in float32
    spared = bytes_spared_with_bitwise_gradients("qwen2", "lean_mlp", torch.bfloat16)
    # per token and layer the module under bf16 autocast keeps x cast twice (for gate and for up: 2 x 32 x 2 B),
    # gate, silu(gate), up and their product (4 x 80 x 2 B); the lean MLP x's cast once, gate and up:
    # 32 x 2 + 2 x 80 x 2 = 384 B less per token and layer, over 30 tokens (the test above) and 2 layers: 23,040 B.
    # Autocast's bf16 casts of the 3 weights (32 x 80 each: 2 layers x 3 x 2,560 x 2 B = 30,720 B) are saved by the
    # module, taken from autocast's cache again by the lean MLP: not counted here, still held in memory by the cache
    assert spared == 30 * 2 * 384 + 2 * 3 * 32 * 80 * 2


def test_cast_mlp_by_hand():
    # x = [1, 2], gate rows [1, 0] and [0, 1], up rows [1, 1] and [2, 0], down [[1, 1]]: gate = [1, 2], up = [3, 2],
    # silu(gate) = [0.7311, 1.7616], product [2.1932, 3.5232], out = 5.7164 (each step rounded to bf16, whose unit
    # is 2**-8 relative: within 2**-6 relative). Upstream 1: d out /
    # d product = [1, 1]; d/d gate = up * silu'(gate), silu'(1) = 0.9277, silu'(2) = 1.0908: [2.7831, 2.1816];
    # d/d up = silu(gate) = [0.7311, 1.7616]; d/d x = gate^T [2.7831, 2.1816] + up^T [0.7311, 1.7616]
    # = [2.7831 + 0.7311 + 3.5232, 2.1816 + 0.7311] = [7.0374, 2.9127]; d/d down = product = [[2.1932, 3.5232]]
    from grpokit.kernels.lean_mlp import LeanCastMLP

    x = torch.tensor([[1.0, 2.0]], requires_grad=True)
    w_gate = torch.tensor([[1.0, 0.0], [0.0, 1.0]], requires_grad=True)
    w_up = torch.tensor([[1.0, 1.0], [2.0, 0.0]], requires_grad=True)
    w_down = torch.tensor([[1.0, 1.0]], requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = LeanCastMLP.apply(x, w_gate, w_up, w_down, torch.bfloat16)
    assert out.dtype == torch.bfloat16
    close = dict(rtol=2**-6, atol=0)
    torch.testing.assert_close(out.float(), torch.tensor([[5.7164]]), **close)
    out.float().sum().backward()
    assert x.grad.dtype == w_gate.grad.dtype == torch.float32
    torch.testing.assert_close(x.grad, torch.tensor([[7.0374, 2.9127]]), **close)
    torch.testing.assert_close(w_down.grad, torch.tensor([[2.1932, 3.5232]]), **close)
    torch.testing.assert_close(w_gate.grad, torch.tensor([[2.7831, 5.5662], [2.1816, 4.3632]]), **close)
    torch.testing.assert_close(w_up.grad, torch.tensor([[0.7311, 1.4622], [1.7616, 3.5232]]), **close)


def test_only_supported_float32_recorded_calls_take_it():
    model = tiny("qwen2")
    x = torch.randn(2, 3, 32, requires_grad=True)
    mlp = model.model.layers[0].mlp
    with lean_mlps(model) as switched:
        assert switched == 2
        assert type(mlp(x).grad_fn).__name__ == "LeanMLPBackward"
        with torch.no_grad():
            assert mlp(x).grad_fn is None
        with torch.autocast("cpu", dtype=torch.bfloat16):  # a float32 x under CPU autocast: the cast version
            assert type(mlp(x).grad_fn).__name__ == "LeanCastMLPBackward"
            assert type(mlp(x.detach().bfloat16().requires_grad_()).grad_fn).__name__ != "LeanCastMLPBackward"
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
