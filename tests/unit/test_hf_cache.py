"""The KV cache goes to a model's forward under the name it declares (grpokit/models/kv_cache_arg.py): ``cache`` in
transformers >= 5.24, where ``past_key_values`` warns on every call ("deprecated and will be removed in version
5.40.0 ... Use `cache` instead"), and ``past_key_values`` in 5.23 (constraints.txt). A model with the new forward
stands in for the newer transformers."""

from __future__ import annotations

import dataclasses
import warnings

import pytest
import torch
from shared_helpers import sampling_params
from transformers import LlamaForCausalLM

from grpokit.kernels import Kernels
from grpokit.models.kv_cache_arg import cache_name
from grpokit.rollout.engine import HFRolloutEngine
from grpokit.rollout.types import Rollouts
from grpokit.testing import build_tiny_causal_lm, build_word_tokenizer
from grpokit.train.learning.policy_logprobs import build_batch, completion_logprobs

CPU = torch.device("cpu")


class NewCacheLlama(LlamaForCausalLM):
    """Llama with the renamed argument and output field, warning on the old name as transformers >= 5.24 does."""

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, cache=None, past_key_values=None, **kw):
        if past_key_values is not None:
            warnings.warn(
                "`past_key_values` is deprecated and will be removed in version 5.40.0. Use `cache`.",
                FutureWarning,
                stacklevel=2,
            )
        out = super().forward(input_ids, attention_mask, position_ids, past_key_values=cache, **kw)
        out.cache = out.past_key_values
        out.past_key_values = None  # only the new field: reading the old one would find no cache
        return out


@pytest.fixture(scope="module")
def models():
    tokenizer = build_word_tokenizer([f"w{i}" for i in range(20)])
    old, _ = build_tiny_causal_lm(None, tokenizer, arch="llama", hidden_size=32, num_layers=1, num_heads=2)
    new = NewCacheLlama(old.config)
    new.load_state_dict(old.state_dict())
    return old.eval(), new.eval(), tokenizer


def plain(kernels: Kernels) -> Kernels:
    return dataclasses.replace(kernels, fused_decoder=False, fused_head=False, packed_linears=False)


def test_the_name_follows_the_forward(models):
    old, new, _ = models
    assert cache_name(old) == "past_key_values"  # transformers 5.23
    assert cache_name(new) == "cache"


def test_generation_and_logprobs_use_the_new_name_without_warnings(models):
    old, new, tokenizer = models
    params = sampling_params(max_completion_length=6)
    out = {}
    for name, model in (("old", old), ("new", new)):
        engine = HFRolloutEngine(model, [tokenizer.eos_token_id], tokenizer.pad_token_id, CPU, seed=0)
        engine.kernels = plain(engine.kernels)
        with warnings.catch_warnings():
            warnings.simplefilter("error", FutureWarning)  # before: the deprecation warning on every decoding step
            rollouts: Rollouts = engine.generate([[4, 5, 6], [7, 8]], 2, params)
            batch = build_batch(model, rollouts, tokenizer.pad_token_id, CPU)
            logprobs, _ = completion_logprobs(model, batch, 1.0, kernels=plain(Kernels.select(CPU)))
        out[name] = rollouts, logprobs
    assert torch.equal(out["old"][0].completion_ids, out["new"][0].completion_ids)
    assert torch.allclose(out["old"][1], out["new"][1], atol=1e-6)
