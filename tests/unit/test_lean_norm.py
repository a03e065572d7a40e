"""The lean RMSNorm: the learner's gradients bitwise those of the HF norms, fewer saved bytes, and the module's own
forward wherever it does not apply."""

import pytest
import torch
from test_lean_mlp import bytes_spared_with_bitwise_gradients, tiny

from grpokit.kernels.lean_norm import LeanRMSNorm, lean_norms

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: see conftest.one_thread


def test_by_hand():
    # x = [3, 4], weight [1, 2], eps 0: mean(x^2) = 12.5, r = 1/sqrt(12.5); out = [3r, 8r] = [0.8485, 2.2627]
    # with upstream [1, 0]: d out0 / d x = w0 (r - x0^2 r^3 / 2) = r - 9 r^3 / 2 = 0.1584 (d/dx1: -x0 x1 r^3 / 2 =
    # -0.1358); d / d weight = [x0 r, 0] = [0.8485, 0]
    x = torch.tensor([3.0, 4.0], requires_grad=True)
    weight = torch.tensor([1.0, 2.0], requires_grad=True)
    out = LeanRMSNorm.apply(x, x, weight, 0.0)
    r = 12.5**-0.5
    torch.testing.assert_close(out, torch.tensor([3 * r, 8 * r]))
    out.backward(torch.tensor([1.0, 0.0]))
    torch.testing.assert_close(x.grad, torch.tensor([r - 4.5 * r**3, -6 * r**3]))
    torch.testing.assert_close(weight.grad, torch.tensor([3 * r, 0.0]))


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "mistral"])
def test_gradients_are_bitwise_the_modules_with_less_saved(arch):
    spared = bytes_spared_with_bitwise_gradients(arch, "lean_norm")
    # per token the module keeps x and x * rsqrt (32 floats each) in the 2 layers' 2 norms and the final one; the
    # lean norm x only: 5 x 32 x 4 B less per token (Qwen3's q and k norms, over 4 + 2 heads of its config's
    # default head_dim 128: 6 x 128 x 4 B less per token in each of the 2 layers). Tokens run: the 2 prompts' 5
    # once each, then each completion's first 5 of 6: 10 + 20 = 30
    tokens = 2 * 5 + 4 * 5
    per_token = 5 * 32 * 4 + (2 * 6 * 128 * 4 if arch == "qwen3" else 0)
    assert spared == tokens * per_token


def test_under_cpu_autocast_the_same_with_less_saved():
    spared = bytes_spared_with_bitwise_gradients("qwen2", "lean_norm", torch.bfloat16)
    # the residual stream stays float32 under autocast, and so do the norms: the same 5 x 32 x 4 B per token of the
    # 30 tokens as without autocast (test above)
    assert spared == 30 * 5 * 32 * 4


def test_only_supported_float32_recorded_calls_take_it():
    model = tiny("qwen2")
    x = torch.randn(2, 3, 32, requires_grad=True)
    norm = model.model.layers[0].input_layernorm
    with lean_norms(model) as switched:
        assert switched == 5  # 2 layers x 2, and the final norm
        assert type(norm(x).grad_fn).__name__ == "LeanRMSNormBackward"
        with torch.no_grad():
            assert norm(x).grad_fn is None
        with torch.autocast("cpu", dtype=torch.bfloat16):  # a float32 x: the norm's ops stay float32
            assert type(norm(x).grad_fn).__name__ == "LeanRMSNormBackward"
            assert type(norm(x.detach().bfloat16().requires_grad_()).grad_fn).__name__ != "LeanRMSNormBackward"
    assert "forward" not in vars(norm)  # restored
    assert type(norm(x).grad_fn).__name__ != "LeanRMSNormBackward"


def test_frozen_weight_gets_no_gradient_and_the_input_gets_its_own():
    norm = tiny("llama").model.norm
    norm.weight.requires_grad_(False)
    x = torch.randn(2, 3, 32, requires_grad=True)
    expected = torch.autograd.grad(norm(x).sum(), x)[0]
    with lean_norms(norm):
        out = norm(x)
    assert type(out.grad_fn).__name__ == "LeanRMSNormBackward"
    assert torch.equal(torch.autograd.grad(out.sum(), x)[0], expected)
    assert norm.weight.grad is None


def test_left_alone_where_it_does_not_apply():
    checkpointed = tiny("qwen2")
    checkpointed.gradient_checkpointing_enable()
    with lean_norms(checkpointed) as switched:  # its recompute runs after the block
        assert switched == 0
    with lean_norms(tiny("qwen2").to(torch.bfloat16)) as switched:
        assert switched == 0
    gemma = torch.nn.RMSNorm(32)  # another class: torch's own
    with lean_norms(gemma) as switched:
        assert switched == 0
