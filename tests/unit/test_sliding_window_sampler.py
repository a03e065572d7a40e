"""The sampler on text models with sliding-window layers (Mistral's window on every layer, Gemma 3's on every other
one), their window (4 tokens) shorter than prompt + completion: its log-probs are one plain forward's. On CPU with
SDPA the sampler gives decoding steps a prepared 4D mask, which HF hands to every layer as is; a window layer's cache
holds only the window, so such models get the 2D padding mask HF cuts per layer (grpokit/rollout/engine.py)."""

from __future__ import annotations

import pytest
import torch
import transformers as T

from grpokit.rollout.engine import HFRolloutEngine
from grpokit.rollout.types import SamplingParams

pytestmark = pytest.mark.usefixtures("one_thread")
SMALL = {"vocab_size": 40, "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 4, "sliding_window": 4,
         "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}  # fmt: skip


def mistral():
    return T.MistralForCausalLM(T.MistralConfig(**SMALL))


def gemma3():  # Gemma 2 keeps eager attention (its logit softcap), so it never got the 4D mask
    config = T.Gemma3TextConfig(**SMALL, layer_types=["sliding_attention", "full_attention"])
    return T.Gemma3ForCausalLM(config)


@pytest.mark.parametrize("build", [mistral, gemma3])
def test_sliding_window_sampling_logprobs_equal_a_plain_forward(build):
    torch.manual_seed(0)
    model = build().float().eval()
    assert model.config._attn_implementation == "sdpa"
    engine = HFRolloutEngine(model, [], 0, torch.device("cpu"), seed=1)
    prompts = [[5, 6, 7, 8, 9, 10], [11, 12, 13]]  # left padding, and prompts past the window
    rollouts = engine.generate(prompts, 2, SamplingParams.plain(6))  # no EOS: 6 tokens each
    for n in range(4):
        sequence = torch.tensor([prompts[n // 2] + rollouts.completion_ids[n].tolist()])
        with torch.no_grad():
            logp = torch.log_softmax(model(sequence).logits[0, -7:-1].float(), -1)  # [6, V]
        expected = logp.gather(-1, rollouts.completion_ids[n][:, None]).squeeze(-1)
        torch.testing.assert_close(rollouts.logprobs[n], expected, atol=1e-5, rtol=0)
