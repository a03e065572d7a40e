"""The fused decoding step: same logits as the HF forward, same generations, and a safe fallback."""

import pytest
import torch
from shared_helpers import sampling_params

import grpokit.kernels.fused_decoder as fused_module
from grpokit.kernels import Kernels
from grpokit.kernels.fused_decoder import FusedDecoder, fused_decoder
from grpokit.kernels.kv_cache import preallocate
from grpokit.rollout.engine import HFRolloutEngine
from grpokit.testing import build_tiny_causal_lm, build_word_tokenizer

CPU = torch.device("cpu")

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: see conftest.one_thread


def tiny_model(arch: str, **config_overrides):
    """A random-init tiny model of ``arch`` (GQA: 4 heads, 2 KV heads), in eval mode."""
    from transformers import AutoModelForCausalLM, LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config

    tokenizer = build_word_tokenizer([f"w{i}" for i in range(60)])
    if arch == "gpt2":
        return build_tiny_causal_lm(tokenizer=tokenizer, arch="gpt2")[0].eval(), tokenizer
    cls = {"llama": LlamaConfig, "qwen2": Qwen2Config, "qwen3": Qwen3Config, "mistral": MistralConfig}[arch]
    config = cls(
        vocab_size=len(tokenizer),
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=96,
        max_position_embeddings=128,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        **config_overrides,
    )
    if arch == "mistral":
        config.sliding_window = config_overrides.get("sliding_window")
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():  # random non-zero biases and norm weights, so each one is exercised
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.add_(torch.randn_like(p) * 0.1)
    return model, tokenizer


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "mistral"])
def test_decoding_steps_give_the_logits_of_a_full_forward_pass(arch):
    model, _ = tiny_model(arch)
    ids = torch.tensor([[5, 9, 11, 14, 20, 21, 30], [7, 7, 8, 40, 41, 2, 3]])  # [2, 7]
    decoder = fused_decoder(model, torch.float32, rows=2)
    assert decoder is not None
    with torch.no_grad():
        expected = model(input_ids=ids).logits  # [2, 7, V]
        cache = model(input_ids=ids[:, :4], use_cache=True).past_key_values
        preallocate(cache, 7)
        mask = torch.ones(2, 1, 1, 7, dtype=torch.bool)
        for t in range(4, 7):  # three steps, each attending to everything before it
            got = decoder.step(ids[:, t], torch.full((2, 1), t), mask[..., : t + 1], cache)
            torch.testing.assert_close(got, expected[:, t], atol=1e-5, rtol=1e-5)


def test_bf16_weights_stay_close_to_float32():
    model, _ = tiny_model("qwen2")
    ids = torch.tensor([[5, 9, 11, 14, 20]])
    decoder = fused_decoder(model, torch.bfloat16, rows=1)
    with torch.no_grad():
        expected = model(input_ids=ids).logits[:, -1]
        with torch.autocast("cpu", dtype=torch.bfloat16):
            cache = model(input_ids=ids[:, :4], use_cache=True).past_key_values
            preallocate(cache, 5)
            got = decoder.step(ids[:, 4], torch.tensor([[4]]), None, cache)
    assert got.dtype == torch.bfloat16
    # bf16 matmuls: ~3 significant digits; the logits here are O(1)
    torch.testing.assert_close(got.float(), expected, atol=0.05, rtol=0.02)


def sample(model, tokenizer, seed=3, **engine_kwargs):
    engine = HFRolloutEngine(model, list(range(2, 12)), tokenizer.pad_token_id, CPU, seed=seed, **engine_kwargs)
    return engine.generate(
        [[20, 21, 22], [30, 31, 32, 33, 34, 35, 36], [40]], 4, sampling_params(max_completion_length=10)
    )


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_generation_with_the_fused_decoder_equals_the_hf_forward(arch, monkeypatch):
    """Same seed, float32: the same tokens (left-padded prompts, rows leaving the batch at stop ids)
    and log-probs equal up to rounding, with and without the fused step."""
    model, tokenizer = tiny_model(arch)
    steps = []
    real_step = FusedDecoder.step
    monkeypatch.setattr(FusedDecoder, "step", lambda self, *a: steps.append(1) or real_step(self, *a))
    fused = sample(model, tokenizer)
    assert steps, "the engine decodes a supported model through the fused step"
    assert len(set(fused.completion_lengths.tolist())) > 1, "rows should stop at different steps"
    monkeypatch.setattr(fused_module, "fused_decoder", lambda *a, **k: None)
    plain = sample(model, tokenizer)
    assert torch.equal(fused.completion_ids, plain.completion_ids)
    torch.testing.assert_close(fused.logprobs, plain.logprobs, atol=1e-5, rtol=1e-5)


def test_unsupported_models_are_not_fused():
    assert fused_decoder(tiny_model("gpt2")[0], torch.float32, 1) is None  # another architecture
    assert fused_decoder(tiny_model("mistral", sliding_window=4)[0], torch.float32, 1) is None  # windowed attention
    assert fused_decoder(tiny_model("llama", hidden_act="gelu")[0], torch.float32, 1) is None  # another MLP activation
    from peft import LoraConfig, get_peft_model

    dora = get_peft_model(tiny_model("llama")[0], LoraConfig(r=4, target_modules=["q_proj"], use_dora=True))
    assert fused_decoder(dora, torch.float32, 1) is None  # DoRA is not a plain weight delta


def lora_model():
    """A tiny Qwen2 with LoRA on attention and MLP, B made non-zero so the adapters change the outputs."""
    from peft import LoraConfig, get_peft_model

    model, tokenizer = tiny_model("qwen2")
    lora = get_peft_model(
        model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "gate_proj", "down_proj"])
    )
    with torch.no_grad():
        for name, p in lora.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5, generator=torch.Generator().manual_seed(len(name)))
    return lora.eval(), tokenizer


def test_lora_adapters_are_merged_into_the_fused_weights():
    lora, _ = lora_model()
    ids = torch.tensor([[5, 9, 11, 14, 20]])
    decoder = fused_decoder(lora, torch.float32, rows=1)
    assert decoder is not None
    with torch.no_grad():
        expected = lora(input_ids=ids).logits[:, -1]
        with lora.disable_adapter():
            base = lora(input_ids=ids).logits[:, -1]
        assert not torch.allclose(expected, base, atol=1e-3), "the adapters should matter here"
        cache = lora(input_ids=ids[:, :4], use_cache=True).past_key_values
        preallocate(cache, 5)
        got = decoder.step(ids[:, 4], torch.tensor([[4]]), None, cache)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_lora_generation_equals_the_peft_forward(monkeypatch):
    lora, tokenizer = lora_model()
    fused = sample(lora, tokenizer)
    monkeypatch.setattr(fused_module, "fused_decoder", lambda *a, **k: None)
    plain = sample(lora, tokenizer)
    assert torch.equal(fused.completion_ids, plain.completion_ids)
    torch.testing.assert_close(fused.logprobs, plain.logprobs, atol=1e-5, rtol=1e-5)


def test_a_model_that_computes_differently_falls_back_to_its_own_forward():
    """A twist the structure check cannot see (here: a layer whose MLP output is doubled) fails the
    one-time comparison with the HF forward, so generation keeps using the model's own forward."""
    model, tokenizer = tiny_model("llama")
    mlp = model.model.layers[0].mlp
    mlp.forward = lambda x, _forward=type(mlp).forward: 2 * _forward(mlp, x)  # noqa: B008
    assert fused_decoder(model, torch.float32, 1) is None
    rollouts = sample(model, tokenizer)
    n, length = 0, int(rollouts.completion_lengths[0])
    with torch.no_grad():  # the sampled log-probs are those of the doubled model
        seq = torch.tensor([[20, 21, 22, *rollouts.completion_ids[n, :length].tolist()]])
        logp = torch.log_softmax(model(seq).logits[0].double(), dim=-1)
    expected = logp[torch.arange(2, 2 + length), rollouts.completion_ids[n, :length]].float()
    torch.testing.assert_close(rollouts.logprobs[n, :length], expected, atol=1e-5, rtol=0)


def test_decode_attention_by_hand():
    # one row, 2 query heads sharing 1 KV head, head_dim 1; keys [0, 1], values [10, 20], scaling ln 3.
    # head 0 (q = 1): scores [0, ln 3] -> softmax [1/4, 3/4] -> 10/4 + 60/4 = 17.5
    # head 1 (q = 0): scores [0, 0] -> [1/2, 1/2] -> 15
    # masking key 0 leaves key 1 alone for both heads -> 20, 20
    from grpokit.kernels.fused_decoder import _decode_attention

    q = torch.tensor([1.0, 0.0]).view(1, 2, 1, 1)
    k = torch.tensor([0.0, 1.0]).view(1, 1, 2, 1)
    v = torch.tensor([10.0, 20.0]).view(1, 1, 2, 1)
    scaling = float(torch.log(torch.tensor(3.0)))
    torch.testing.assert_close(_decode_attention(q, k, v, None, scaling), torch.tensor([[[17.5, 15.0]]]))
    mask = torch.tensor([False, True]).view(1, 1, 1, 2)
    torch.testing.assert_close(_decode_attention(q, k, v, mask, scaling), torch.tensor([[[20.0, 20.0]]]))


@pytest.mark.parametrize("dtype, cpu", [(torch.bfloat16, "avx2"), (torch.float32, "aarch64")])
def test_generation_without_weight_packing_gives_the_same_numbers(dtype, cpu, monkeypatch):
    """The fused decoder on a CPU whose probe rules oneDNN packing out (bf16 on an AVX2-only CPU, anything
    on Arm) runs F.linear on the same fused weights: the same tokens and log-probs as with packing."""
    from grpokit.kernels.packed_linear import packing_available

    if not packing_available(CPU, dtype):
        pytest.skip(
            f"compares {dtype} weight packing with its fallback: this CPU cannot pack {dtype} (oneDNN "
            "needs x86-64, and for bf16 AVX512BW + AVX512VL + AVX512DQ or AVX-NE-CONVERT)"
        )
    model, tokenizer = tiny_model("qwen2")
    autocast = None if dtype == torch.float32 else dtype
    steps, packs = [], []
    real_step, real_pack = FusedDecoder.step, fused_module.pack
    monkeypatch.setattr(FusedDecoder, "step", lambda self, *a: steps.append(1) or real_step(self, *a))
    monkeypatch.setattr(fused_module, "pack", lambda *a: packs.append(real_pack(*a)) or packs[-1])
    kernels = Kernels.select(CPU, autocast)  # one run's kernels: the model's check against HF runs once
    packed = sample(model, tokenizer, autocast_dtype=autocast, kernels=kernels)
    assert packs and all(p is not None for p in packs)
    packs.clear()
    monkeypatch.setenv("GRPOKIT_CPU_CAPS", cpu)
    fallback = sample(model, tokenizer, autocast_dtype=autocast, kernels=kernels)
    assert packs and all(p is None for p in packs)
    assert len(steps) > 2, "both generations decode through the fused step"
    assert torch.equal(packed.completion_ids, fallback.completion_ids)
    torch.testing.assert_close(packed.logprobs, fallback.logprobs, atol=1e-5, rtol=1e-5)
