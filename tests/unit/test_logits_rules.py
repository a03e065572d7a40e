"""The logits processors grpokit's sampler honours (TRL's repetition_penalty and generation_kwargs): hand-worked
numbers on tiny vocabularies, agreement with transformers' own processors, and every sampling path (the cached
HF engine with and without the fused decoder, full-forward decoding of custom modules) against transformers'
greedy ``generate``."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from shared_helpers import sampling_params

from grpokit.rollout.logits_rules import LogitsRules, logits_rules
from grpokit.rollout.next_token import sample_next
from grpokit.rollout.types import SamplingParams

pytestmark = pytest.mark.usefixtures("one_thread")


def rules(params: SamplingParams, histories, eos=(3,), vocab=4) -> LogitsRules:
    return LogitsRules(params, histories, list(eos), vocab)


def test_repetition_penalty_by_hand():
    # vocab of 4, logits [2, -1, 0.5, 3]; the row holds tokens 0 and 1 (prompt [0], sampled 1), penalty 2:
    # token 0 (positive) 2 / 2 = 1, token 1 (negative) -1 * 2 = -2, tokens 2 and 3 unseen: unchanged.
    r = rules(sampling_params(1, repetition_penalty=2.0), [[0]])
    r.append([0], torch.tensor([1]))
    out = r.apply(torch.tensor([[2.0, -1.0, 0.5, 3.0]]), [0], 1)
    assert out.tolist() == [[1.0, -2.0, 0.5, 3.0]]
    # greedy: logits [3, 2, 0, 0], token 0 seen: 3 / 2 = 1.5 < 2, so token 1 wins; the log-prob returned is the
    # model's, log softmax([3, 2, 0, 0])[1] = 2 - log(e^3 + e^2 + 2) = 2 - 3.35725 = -1.35725
    r = rules(sampling_params(1, greedy=True, repetition_penalty=2.0), [[0]])
    logits = torch.tensor([[3.0, 2.0, 0.0, 0.0]])
    token, logprob = sample_next(logits, r.params, None, r.apply(logits, [0], 0))
    assert token.tolist() == [1]
    assert logprob.item() == pytest.approx(2 - math.log(math.exp(3) + math.exp(2) + 2), abs=1e-6)


def test_repetition_penalty_changes_the_drawn_distribution_not_the_log_prob():
    # logits ln [1, 1, 2, 0+] (p = 0.25, 0.25, 0.5, 0); token 2 seen, penalty 2: ln 2 / 2 = ln sqrt(2), so the draw
    # weighs 1 : 1 : sqrt(2): p(2) = 1.41421 / 3.41421 = 0.414214. The log-prob stays ln 0.5 for token 2.
    logits = torch.tensor([[0.0, 0.0, math.log(2.0), -1e9]]).repeat(6000, 1)
    params = sampling_params(1, repetition_penalty=2.0)
    r = rules(params, [[2]] * 6000)
    tokens, logprobs = sample_next(logits, params, torch.Generator().manual_seed(0), r.apply(logits, range(6000), 0))
    assert (tokens == 2).float().mean().item() == pytest.approx(0.414214, abs=0.02)
    assert logprobs[tokens == 2][0].item() == pytest.approx(math.log(0.5), abs=1e-6)


def test_suppress_and_begin_suppress_tokens():
    logits = torch.zeros(3, 4)
    r = rules(sampling_params(1, suppress_tokens=(1,), begin_suppress_tokens=(2,)), [[0], [0], [0]])
    out = r.apply(logits, [0, 1, 2], torch.tensor([0, 1, 5]))  # rows at their 1st, 2nd and 6th new token
    inf = float("-inf")
    assert out.tolist() == [[0.0, inf, inf, 0.0], [0.0, inf, 0.0, 0.0], [0.0, inf, 0.0, 0.0]]
    tokens, _ = sample_next(logits.repeat(1000, 1), r.params, torch.Generator().manual_seed(1), out.repeat(1000, 1))
    assert 1 not in tokens.tolist() and set(tokens[::3].tolist()) == {0, 3}  # row 0's copies: neither 1 nor 2


def test_min_new_tokens_holds_eos_back():
    # EOS = 3, min_new_tokens 2: banned at the 1st and 2nd new token (0 and 1 sampled so far), free from the 3rd
    r = rules(sampling_params(1, min_new_tokens=2), [[0]] * 3)
    out = r.apply(torch.zeros(3, 4), [0, 1, 2], [0, 1, 2])
    assert torch.isinf(out[:, 3]).tolist() == [True, True, False] and not torch.isinf(out[:, :3]).any()


def test_no_repeat_ngram_size_by_hand():
    # n = 2, the row holds [1, 2, 3, 1]: the bigrams are (1,2) (2,3) (3,1); it ends with 1, so 2 would repeat (1,2)
    r = rules(sampling_params(1, no_repeat_ngram_size=2), [[1, 2, 3]], eos=(), vocab=5)
    r.append([0], torch.tensor([1]))
    out = r.apply(torch.zeros(1, 5), [0], 1)
    assert torch.isinf(out[0]).tolist() == [False, False, True, False, False]
    r.append([0], torch.tensor([4]))  # [1, 2, 3, 1, 4]: nothing ever followed 4
    assert not torch.isinf(r.apply(torch.zeros(1, 5), [0], 2)).any()
    # n = 1: every token already present is banned
    r1 = rules(sampling_params(1, no_repeat_ngram_size=1), [[1, 3]], eos=(), vocab=5)
    assert torch.isinf(r1.apply(torch.zeros(1, 5), [0], 0)[0]).tolist() == [False, True, False, True, False]


def test_bad_words_ids_by_hand():
    # words [3] (EOS: dropped, as transformers does), [2] (always banned) and [0, 1] (1 banned right after 0)
    r = rules(sampling_params(1, bad_words_ids=((3,), (2,), (0, 1))), [[1, 0], [0, 1]])
    out = r.apply(torch.zeros(2, 4), [0, 1], 0)
    assert torch.isinf(out).tolist() == [[False, True, True, False], [False, False, True, False]]


def test_rows_follow_append_and_reset():
    # the batch's rows are a subset in any order; reset replaces a row's context (a multi-turn rollout rejoining)
    r = rules(sampling_params(1, repetition_penalty=2.0), [[0], [1]])
    r.append(torch.tensor([1]), torch.tensor([2]))  # row 1 now holds 1, 2
    out = r.apply(torch.ones(2, 4), [1, 0], 3)
    assert out.tolist() == [[1.0, 0.5, 0.5, 1.0], [0.5, 1.0, 1.0, 1.0]]
    r.reset(1, [3])
    assert r.apply(torch.ones(1, 4), [1], 0).tolist() == [[1.0, 1.0, 1.0, 0.5]]


def test_ids_beyond_the_vocabulary_are_refused():
    with pytest.raises(ValueError, match=r"suppress_tokens names token ids \[7\], beyond the model's vocabulary of 4"):
        rules(sampling_params(1, suppress_tokens=(1, 7)), [[0]])


def test_no_rule_no_object():
    assert logits_rules(sampling_params(4, top_k=3, min_p=0.1), [[0]], [3], 4) is None


def test_same_as_transformers_processors():
    """Random logits and contexts: LogitsRules gives what transformers' processors give for the same settings."""
    from transformers.generation.logits_process import (
        LogitsProcessorList,
        MinNewTokensLengthLogitsProcessor,
        NoBadWordsLogitsProcessor,
        NoRepeatNGramLogitsProcessor,
        RepetitionPenaltyLogitsProcessor,
        SuppressTokensAtBeginLogitsProcessor,
        SuppressTokensLogitsProcessor,
    )

    g = torch.Generator().manual_seed(0)
    V, prompt_length, eos = 12, 5, [11]
    for generated in (0, 1, 4):
        ids = torch.randint(0, 6, (6, prompt_length + generated), generator=g)  # few ids: repeats are common
        logits = torch.randn(6, V, generator=g) * 3
        params = sampling_params(
            1,
            repetition_penalty=1.7,
            no_repeat_ngram_size=2,
            min_new_tokens=2,
            suppress_tokens=(7,),
            begin_suppress_tokens=(8,),
            bad_words_ids=((11,), (9,), (ids[0, -1].item(), 10)),
        )
        theirs = LogitsProcessorList(
            [
                RepetitionPenaltyLogitsProcessor(1.7),
                NoRepeatNGramLogitsProcessor(2),
                NoBadWordsLogitsProcessor([list(w) for w in params.bad_words_ids], eos),
                MinNewTokensLengthLogitsProcessor(prompt_length, 2, eos),
                SuppressTokensLogitsProcessor([7]),
                SuppressTokensAtBeginLogitsProcessor([8], prompt_length),
            ]
        )(ids, logits.clone())
        r = LogitsRules(params, ids[:, :prompt_length].tolist(), eos, V)
        for t in range(generated):
            r.append(range(6), ids[:, prompt_length + t])
        ours = r.apply(logits, range(6), generated)
        torch.testing.assert_close(ours, theirs, rtol=0, atol=0)


# Without options this tiny model repeats the prompt's last token to the end (5 5 5 ..., 9 9 9 ...); each set
# below changes that (checked against transformers' own output in the test).
OPTIONS = [
    {"repetition_penalty": 10.0},
    {"repetition_penalty": 10.0, "min_new_tokens": 9},  # penalised, it writes EOS early; held back to 9 tokens
    {"repetition_penalty": 0.5, "no_repeat_ngram_size": 2},
    {"suppress_tokens": (9,), "begin_suppress_tokens": (5,)},
    {"bad_words_ids": ((9,), (5, 5))},
]


@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: "+".join(o))
@pytest.mark.parametrize("path", ["fused", "hf_forward", "custom_module"])
def test_greedy_generation_is_transformers_generate(options, path, tiny_model_dir):
    """Greedy decoding with the options gives transformers' ``generate(do_sample=False, **options)`` tokens, on
    every path: the fused decoder (Llama on CPU), the model's own forward with its KV cache, and full-forward
    decoding of a custom ``forward(input_ids) -> logits`` module."""
    from transformers import AutoModelForCausalLM

    from grpokit.kernels import Kernels
    from grpokit.rollout.engine import HFRolloutEngine

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    eos = model.generation_config.eos_token_id
    eos = [eos] if isinstance(eos, int) else list(eos)
    prompts = [[5, 6, 7, 5], [8, 9]]
    T = 12
    hf_options = {
        k: [list(w) for w in v] if k == "bad_words_ids" else list(v) if isinstance(v, tuple) else v
        for k, v in options.items()
    }

    def generate(prompt, **kwargs):  # one prompt per call: no padding in transformers' contexts
        out = model.generate(
            torch.tensor([prompt]), do_sample=False, max_new_tokens=T, eos_token_id=eos, pad_token_id=eos[0], **kwargs
        )[0, len(prompt) :].tolist()
        return out[: out.index(eos[0]) + 1] if eos[0] in out else out

    expected = [generate(prompt, **hf_options) for prompt in prompts]
    assert expected != [generate(prompt) for prompt in prompts]  # the options change what greedy decoding writes

    class Logits(torch.nn.Module):  # a custom module: forward(input_ids) -> logits, no cache
        def __init__(self, lm):
            super().__init__()
            self.lm = lm

        def forward(self, input_ids):
            return self.lm(input_ids=input_ids).logits

    kernels = dataclasses.replace(Kernels.select(torch.device("cpu"), None), fused_decoder=path == "fused")
    policy = Logits(model) if path == "custom_module" else model
    engine = HFRolloutEngine(policy, eos, eos[0], torch.device("cpu"), kernels=kernels)
    if path == "fused":
        assert kernels.decoder(model, torch.float32, 4) is not None  # the path under test is taken
    rollouts = engine.generate(prompts, 2, sampling_params(T, greedy=True, **options))
    for row in range(4):
        n = int(rollouts.completion_mask[row].sum())
        assert rollouts.completion_ids[row, :n].tolist() == expected[row // 2], (path, row)
