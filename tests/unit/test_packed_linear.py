"""Pre-packed Linear weights for sampling on CPU: same numbers as F.linear, restored afterwards."""

import contextlib

import pytest
import torch

from grpokit.rollout import engine as engine_module
from grpokit.rollout.engine import HFRolloutEngine
from grpokit.rollout.packed_linear import packed_linears, packing_available
from grpokit.rollout.types import SamplingParams
from grpokit.testing import build_tiny_causal_lm, build_word_tokenizer

CPU = torch.device("cpu")
pytestmark = [pytest.mark.skipif(not packing_available(CPU), reason="this torch build has no oneDNN Linear packing"),
              pytest.mark.usefixtures("one_thread")]


@pytest.fixture(scope="module")
def tiny():
    tokenizer = build_word_tokenizer([f"w{i}" for i in range(60)])
    model, _ = build_tiny_causal_lm(tokenizer=tokenizer, arch="qwen2", num_kv_heads=2)
    return model.eval(), tokenizer


@pytest.mark.parametrize("rows", [1, 5, 32])
def test_packed_layer_matches_f_linear(rows):
    torch.manual_seed(0)
    linear = torch.nn.Linear(48, 80)
    x = torch.randn(rows, 3, 48)
    expected = linear(x)
    with torch.no_grad(), packed_linears(linear, None, rows=8, device=CPU) as packed:  # packed for 8 rows, used with others
        assert packed == 1
        got = linear(x)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)  # float32: rounding only
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        expected_bf16 = linear(x)
        with packed_linears(linear, torch.bfloat16, rows=8, device=CPU):
            got_bf16 = linear(x)
    assert got_bf16.dtype == expected_bf16.dtype == torch.bfloat16
    assert torch.equal(got_bf16, expected_bf16)  # bf16: bitwise the autocast result
    assert "forward" not in vars(linear)  # restored: the class's forward again
    linear(x).sum().backward()  # and differentiable again
    assert linear.weight.grad is not None


def test_model_logits_match(tiny):
    model, _ = tiny
    ids = torch.randint(4, 60, (3, 7))
    with torch.no_grad():
        expected = model(ids).logits
        with packed_linears(model, None, rows=3, device=CPU) as packed:
            got = model(ids).logits
    assert packed == sum(type(m) is torch.nn.Linear for m in model.modules()) > 0
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_generation_with_packing_matches_without_in_float32(tiny, monkeypatch):
    """Same seed, float32 (where the engine packs): the same tokens, log-probs equal up to rounding."""
    model, tokenizer = tiny
    params = SamplingParams(max_completion_length=6, temperature=1.0)
    prompts = [[5, 6, 7], [8, 9]]
    calls = []

    def sample():
        engine = HFRolloutEngine(model, [tokenizer.eos_token_id], tokenizer.pad_token_id, CPU, seed=3)
        return engine.generate(prompts, 4, params)

    # the Llama-family fused decoder packs its own weights; packed_linears serves the other architectures
    monkeypatch.setattr(engine_module, "fused_decoder", lambda *a, **k: None)
    real = engine_module.packed_linears
    monkeypatch.setattr(engine_module, "packed_linears", lambda *a, **k: calls.append(1) or real(*a, **k))
    packed = sample()
    assert calls  # the float32 engine did pack
    monkeypatch.setattr(engine_module, "packed_linears", lambda *a, **k: contextlib.nullcontext())
    plain = sample()
    assert torch.equal(packed.completion_ids, plain.completion_ids)
    torch.testing.assert_close(packed.logprobs, plain.logprobs, atol=1e-5, rtol=1e-5)
