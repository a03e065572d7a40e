"""Pre-packed Linear weights for sampling on CPU: same numbers as F.linear, restored afterwards."""

import contextlib
import warnings

import pytest
import torch
from shared_helpers import sampling_params

from grpokit.kernels import fused_decoder as fused_module
from grpokit.kernels import packed_linear
from grpokit.kernels.packed_linear import packed_linears, packing_available
from grpokit.rollout.engine import HFRolloutEngine
from grpokit.testing import build_tiny_causal_lm, build_word_tokenizer

CPU = torch.device("cpu")
pytestmark = [
    pytest.mark.skipif(
        not packing_available(CPU), reason="packs Linear weights: needs an x86-64 CPU and a torch build with oneDNN"
    ),
    pytest.mark.usefixtures("one_thread"),
]
needs_bf16_packing = pytest.mark.skipif(
    not packing_available(CPU, torch.bfloat16),
    reason="packs bf16 weights: needs a CPU with oneDNN's bf16 kernels "
    "(AVX512BW + AVX512VL + AVX512DQ, or AVX-NE-CONVERT)",
)


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
    with (
        torch.no_grad(),
        packed_linears(linear, None, rows=8, device=CPU) as packed,
    ):  # packed for 8 rows, used with others
        assert packed == 1
        got = linear(x)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)  # float32: rounding only
    assert "forward" not in vars(linear)  # restored: the class's forward again
    linear(x).sum().backward()  # and differentiable again
    assert linear.weight.grad is not None


@needs_bf16_packing
@pytest.mark.parametrize("rows", [1, 5, 32])
def test_bf16_packed_layer_is_bitwise_autocast(rows):
    torch.manual_seed(0)
    linear = torch.nn.Linear(48, 80)
    x = torch.randn(rows, 3, 48)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        expected_bf16 = linear(x)
        with packed_linears(linear, torch.bfloat16, rows=8, device=CPU) as packed:
            got_bf16 = linear(x)
    assert packed == 1
    assert got_bf16.dtype == expected_bf16.dtype == torch.bfloat16
    assert torch.equal(got_bf16, expected_bf16)  # bf16: bitwise the autocast result
    assert "forward" not in vars(linear)


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
    params = sampling_params(max_completion_length=6, temperature=1.0)
    prompts = [[5, 6, 7], [8, 9]]
    calls = []

    def sample():
        engine = HFRolloutEngine(model, [tokenizer.eos_token_id], tokenizer.pad_token_id, CPU, seed=3)
        return engine.generate(prompts, 4, params)

    # the Llama-family fused decoder packs its own weights; packed_linears serves the other architectures
    monkeypatch.setattr(fused_module, "fused_decoder", lambda *a, **k: None)
    real = packed_linear.packed_linears
    monkeypatch.setattr(packed_linear, "packed_linears", lambda *a, **k: calls.append(1) or real(*a, **k))
    packed = sample()
    assert calls  # the float32 engine did pack
    monkeypatch.setattr(packed_linear, "packed_linears", lambda *a, **k: contextlib.nullcontext())
    plain = sample()
    assert torch.equal(packed.completion_ids, plain.completion_ids)
    torch.testing.assert_close(packed.logprobs, plain.logprobs, atol=1e-5, rtol=1e-5)


@needs_bf16_packing
def test_cpu_without_bf16_kernels_keeps_bf16_on_f_linear(monkeypatch):
    """An AVX2-only CPU (forced probe): bf16 layers stay on F.linear, with the packed result's numbers;
    float32 still packs."""
    torch.manual_seed(0)
    linear = torch.nn.Linear(48, 80)
    x = torch.randn(5, 48)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        with packed_linears(linear, torch.bfloat16, rows=5, device=CPU) as packed:
            fast = linear(x)
        assert packed == 1
        monkeypatch.setenv("GRPOKIT_CPU_CAPS", "avx2")
        with packed_linears(linear, torch.bfloat16, rows=5, device=CPU) as packed:
            fallback = linear(x)
        assert packed == 0
    assert torch.equal(fallback, fast)
    with torch.no_grad(), packed_linears(linear, None, rows=5, device=CPU) as packed:
        assert packed == 1


def test_arm_cpu_packs_nothing(monkeypatch, tiny):
    """aarch64 (forced probe): oneDNN packing is an x86 fast path; the model runs on F.linear, same logits."""
    model, _ = tiny
    ids = torch.randint(4, 60, (3, 7))
    with torch.no_grad():
        with packed_linears(model, None, rows=3, device=CPU):
            packed_logits = model(ids).logits
        monkeypatch.setenv("GRPOKIT_CPU_CAPS", "aarch64")
        with packed_linears(model, None, rows=3, device=CPU) as packed:
            logits = model(ids).logits
    assert packed == 0
    torch.testing.assert_close(logits, packed_logits, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("op", ["_reorder", "_linear_pointwise"])
def test_packing_op_refusing_falls_back_once_with_a_warning(op, monkeypatch, tiny):
    """The probe said yes but oneDNN raises, when packing (as torch does on a CPU without bf16 kernels) or
    at the first call: F.linear, the same logits, one warning for the whole model, and no further attempt."""
    model, _ = tiny
    ids = torch.randint(4, 60, (3, 7))
    monkeypatch.setattr(packed_linear, "_refused", set())
    monkeypatch.setattr(packed_linear, "_working", set())
    attempts = []

    def refuse(*args):
        attempts.append(1)
        raise RuntimeError(
            "mkldnn_reorder_linear_weight: bf16 path needs the cpu support avx_ne_convert or avx512bw, "
            "avx512vl and avx512dq"
        )

    monkeypatch.setattr(packed_linear, op, refuse)
    with torch.no_grad():
        expected = model(ids).logits
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for _ in range(2):
                with packed_linears(model, None, rows=3, device=CPU) as packed:
                    assert packed == 0
                    got = model(ids).logits
    assert len(attempts) == 1
    assert len(caught) == 1 and "cannot pack torch.float32" in str(caught[0].message)
    assert "avx512bw" in str(caught[0].message)
    assert torch.equal(got, expected)
