"""The own sampling loop: preallocated KV cache, inverse-CDF sampler, log-probs equal to a plain forward pass."""

import math

import pytest
import torch
from shared_helpers import sampling_params
from transformers.cache_utils import DynamicLayer

from grpokit.kernels.kv_cache import PreallocatedLayer
from grpokit.rollout.engine import HFRolloutEngine
from grpokit.rollout.next_token import inverse_cdf, sample_next
from grpokit.testing import build_tiny_causal_lm, build_word_tokenizer

CPU = torch.device("cpu")


pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: see conftest.one_thread


@pytest.fixture(scope="module", params=["qwen2", "llama"])
def tiny(request):
    tokenizer = build_word_tokenizer([f"w{i}" for i in range(60)])
    model, _ = build_tiny_causal_lm(tokenizer=tokenizer, arch=request.param, num_kv_heads=2)
    return model.eval(), tokenizer


def plain_logprobs(model, prompt, completion, temperature):
    """log softmax(logits / T) of each completion token from one unpadded forward pass of prompt + completion."""
    seq = torch.tensor([prompt + completion])
    with torch.no_grad():
        logp = torch.log_softmax(model(seq).logits[0].double() / temperature, dim=-1)  # [L, V]
    positions = torch.arange(len(prompt) - 1, len(prompt) - 1 + len(completion))
    return logp[positions, torch.tensor(completion)].float()


def test_sampling_logprobs_equal_a_plain_forward_pass(tiny):
    model, tokenizer = tiny
    # prompts of different lengths (left padding in the shared prefill) and ten stop ids, so rows
    # leave the batch at different steps and the cache drops rows mid-generation
    engine = HFRolloutEngine(
        model, eos_token_ids=list(range(2, 12)), pad_token_id=tokenizer.pad_token_id, device=CPU, seed=3
    )
    prompts = [[20, 21, 22], [30, 31, 32, 33, 34, 35, 36], [40]]
    rollouts = engine.generate(prompts, 4, sampling_params(max_completion_length=12, temperature=0.7))
    lengths = rollouts.completion_lengths.tolist()
    assert len(set(lengths)) > 2, "the seed should give completions of several lengths"
    for n, length in enumerate(lengths):
        completion = rollouts.completion_ids[n, :length].tolist()
        expected = plain_logprobs(model, prompts[n // 4], completion, temperature=0.7)
        torch.testing.assert_close(rollouts.logprobs[n, :length], expected, atol=1e-5, rtol=0)
        stopped = rollouts.finish_reasons[n] == "stop"
        assert stopped == (2 <= completion[-1] < 12)
        assert all(not 2 <= t < 12 for t in completion[:-1]), "no stop id before the last token"
        assert (rollouts.completion_ids[n, length:] == tokenizer.pad_token_id).all()
        assert (rollouts.logprobs[n, length:] == 0).all()


def test_generation_under_bf16_autocast_stays_close(tiny):
    # bf16 matmuls: the sampled tokens' log-probs still match a float32 forward pass to ~bf16 precision
    model, tokenizer = tiny
    engine = HFRolloutEngine(
        model, [tokenizer.eos_token_id], tokenizer.pad_token_id, CPU, seed=0, autocast_dtype=torch.bfloat16
    )
    rollouts = engine.generate([[20, 21, 22]], 4, sampling_params(max_completion_length=8))
    for n in range(4):
        length = int(rollouts.completion_lengths[n])
        expected = plain_logprobs(model, [20, 21, 22], rollouts.completion_ids[n, :length].tolist(), temperature=1.0)
        torch.testing.assert_close(rollouts.logprobs[n, :length], expected, atol=5e-2, rtol=0)


def test_preallocated_layer_matches_dynamic_layer():
    gen = torch.Generator().manual_seed(0)
    keys, values = torch.randn(2, 3, 4, 5, generator=gen), torch.randn(2, 3, 4, 5, generator=gen)
    dynamic = DynamicLayer()
    dynamic.update(keys, values)
    pre = PreallocatedLayer(keys, values, capacity=8)
    for layer in (dynamic, pre):
        layer.batch_repeat_interleave(2)  # 2 -> 4 rows
    for _ in range(3):
        k, v = torch.randn(4, 3, 1, 5, generator=gen), torch.randn(4, 3, 1, 5, generator=gen)
        expected = dynamic.update(k, v)
        got = pre.update(k, v)
        torch.testing.assert_close(got, expected, rtol=0, atol=0)
    for layer in (dynamic, pre):
        layer.batch_select_indices(torch.tensor([3, 0]))
    torch.testing.assert_close((pre.keys, pre.values), (dynamic.keys, dynamic.values), rtol=0, atol=0)
    assert pre.get_seq_length() == dynamic.get_seq_length() == 7
    pre.update(torch.zeros(2, 3, 1, 5), torch.zeros(2, 3, 1, 5))  # position 8 of 8
    with pytest.raises(ValueError, match="KV cache full"):
        pre.update(torch.zeros(2, 3, 1, 5), torch.zeros(2, 3, 1, 5))


def test_sample_next_by_hand():
    # logits [0, ln 3] -> p = [0.25, 0.75]: greedy takes token 1 with log p = ln 0.75 = -0.287682;
    # at temperature 2 the logits are [0, ln 3 / 2] -> p(1) = sqrt(3) / (1 + sqrt(3)) = 0.633975, ln = -0.455706
    logits = torch.tensor([[0.0, math.log(3.0)]])
    tokens, logprobs = sample_next(logits, sampling_params(1, greedy=True), None)
    assert tokens.tolist() == [1] and logprobs.item() == pytest.approx(-0.287682, abs=1e-6)
    tokens, logprobs = sample_next(
        logits.repeat(4000, 1), sampling_params(1, temperature=2.0), torch.Generator().manual_seed(0)
    )
    expected = torch.where(tokens == 1, math.log(0.633975), math.log(1 - 0.633975))
    torch.testing.assert_close(logprobs, expected.float(), atol=1e-5, rtol=0)
    assert (tokens == 1).float().mean().item() == pytest.approx(0.633975, abs=0.03)


def test_top_k_and_top_p_only_draw_allowed_tokens():
    # p = [0.6, 0.3, 0.1]: top_p = 0.5 keeps token 0 alone (0.6 already >= 0.5);
    # top_p = 0.7 keeps tokens 0 and 1 (the mass above token 1 is 0.6 < 0.7, above token 2 is 0.9);
    # top_k = 2 keeps tokens 0 and 1, drawn 2:1. The log-prob stays the unfiltered log p.
    logits = torch.tensor([[0.6, 0.3, 0.1]]).log().repeat(3000, 1)
    gen = torch.Generator().manual_seed(0)
    tokens, logprobs = sample_next(logits, sampling_params(1, top_p=0.5), gen)
    assert set(tokens.tolist()) == {0} and logprobs[0].item() == pytest.approx(math.log(0.6), abs=1e-6)
    tokens, _ = sample_next(logits, sampling_params(1, top_p=0.7), gen)
    assert set(tokens.tolist()) == {0, 1}
    tokens, logprobs = sample_next(logits, sampling_params(1, top_k=2), gen)
    assert set(tokens.tolist()) == {0, 1} and (tokens == 0).float().mean().item() == pytest.approx(2 / 3, abs=0.03)
    assert logprobs[tokens == 1][0].item() == pytest.approx(math.log(0.3), abs=1e-6)


def test_inverse_cdf_frequencies_across_blocks():
    # weights 1 at index 5, 3 at index 300 (another 256-wide block), 0 elsewhere, 4 at the last index
    # of a padded vocabulary (1000 = 3 * 256 + 232): frequencies 1/8, 3/8, 4/8; zero weights never drawn
    weights = torch.zeros(1, 1000)
    weights[0, 5], weights[0, 300], weights[0, 999] = 1.0, 3.0, 4.0
    draws = inverse_cdf(weights.repeat(40_000, 1), torch.Generator().manual_seed(1))
    counts = torch.bincount(draws, minlength=1000).float() / len(draws)
    assert set(draws.unique().tolist()) == {5, 300, 999}
    torch.testing.assert_close(counts[[5, 300, 999]], torch.tensor([0.125, 0.375, 0.5]), atol=0.01, rtol=0)


def test_inverse_cdf_short_last_block_stays_inside_the_vocabulary():
    # V = 300 is a full block of 256 and a last block of 44 entries; V = 7 a single short block. All weight on the
    # last entry: every draw is that entry, never a position past V (the last block is summed alone, not padded)
    for vocabulary in (300, 7):
        weights = torch.zeros(64, vocabulary)
        weights[:, -1] = 1.0
        draws = inverse_cdf(weights, torch.Generator().manual_seed(0))
        assert draws.tolist() == [vocabulary - 1] * 64


def test_inverse_cdf_rejects_non_finite_weights():
    with pytest.raises(ValueError, match="NaN/inf"):
        inverse_cdf(torch.tensor([[0.5, float("nan")]]), None)
