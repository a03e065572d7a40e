"""generation.engine: transformers samples with transformers' own generate (TRL's generation_kwargs grpokit's
sampler cannot honour, such as beam search) and gives the policy's log-probs of what it sampled."""

from __future__ import annotations

import pytest
import torch
from shared_helpers import sampling_params

from grpokit.rollout.transformers_engine import TransformersRolloutEngine

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def model(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()


PROMPTS = [[5, 6, 7], [8, 9]]  # two prompts of different lengths: left padding is exercised


def test_beam_search_completions_are_generates_and_logprobs_the_policys(model):
    eos = [1]
    engine = TransformersRolloutEngine(model, eos, pad_token_id=0, device=torch.device("cpu"))
    params = sampling_params(6, greedy=True, transformers_kwargs={"num_beams": 3, "length_penalty": -0.1})
    out = engine.generate(PROMPTS, num_generations=2, params=params)

    # expected: transformers' generate on the same left-padded batch, each prompt repeated G = 2 times
    ids = torch.tensor([[5, 6, 7], [5, 6, 7], [0, 8, 9], [0, 8, 9]])
    mask = (ids != 0).long()
    mask[:, 0] = torch.tensor([1, 1, 0, 0])
    expected = model.generate(
        input_ids=ids,
        attention_mask=mask,
        max_new_tokens=6,
        do_sample=False,
        num_beams=3,
        length_penalty=-0.1,
        eos_token_id=eos,
        pad_token_id=0,
    )[:, 3:]
    lengths = out.completion_mask.sum(1).long()
    for row in range(4):
        n = int(lengths[row])
        assert out.completion_ids[row, :n].tolist() == expected[row, :n].tolist()
        assert (n == 6) != (out.finish_reasons[row] == "stop")

    # log-probs: log softmax of the policy's logits at each completion token, from a plain full forward pass
    for row in range(4):
        prompt = [t for t in ids[row].tolist() if t != 0]
        n = int(lengths[row])
        seq = torch.tensor([prompt + out.completion_ids[row, :n].tolist()])
        with torch.no_grad():
            logp = torch.log_softmax(model(seq).logits[0, len(prompt) - 1 : -1].float(), -1)
        want = logp.gather(-1, seq[0, len(prompt) :, None]).squeeze(-1)
        torch.testing.assert_close(out.logprobs[row, :n], want, rtol=1e-4, atol=1e-5)
        assert (out.logprobs[row, n:] == 0).all()


def test_sampling_is_seeded_by_the_engines_stream(model):
    """Two engines with one seed sample the same; the global RNG is left as it was."""
    params = sampling_params(5, temperature=1.5, transformers_kwargs={"typical_p": 0.9})

    def sample(seed):
        engine = TransformersRolloutEngine(model, [1], 0, torch.device("cpu"), seed=seed)
        return engine.generate(PROMPTS, 3, params).completion_ids

    state = torch.get_rng_state()
    assert torch.equal(sample(4), sample(4))
    assert torch.equal(torch.get_rng_state(), state)


def test_a_custom_module_is_refused_in_one_line():
    from grpokit.config import ConfigError
    from grpokit.rollout.engines import EngineParts, get_engine

    parts = EngineParts(torch.nn.Linear(2, 2), [1], 0, torch.device("cpu"), seed=0, trust_remote_code=False)
    with pytest.raises(ConfigError, match="custom forward"):
        get_engine("transformers").build(parts, None)
