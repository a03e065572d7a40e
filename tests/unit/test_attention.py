"""grpokit.kernels.attention: the plain small-shape attention gives SDPA numbers, and the learner's switch to it.

The function is compared with ``sdpa_attention_forward`` (outputs and gradients, float32, 1e-5) on the
masks HF's own ``sdpa_mask`` makes for the learner's calls; the learner's log-probs and gradients with
the switch equal those without it; the model's attention implementation is restored after the block.
"""

import contextlib
import copy

import pytest
import torch
from shared_helpers import sampling_params
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import sdpa_mask

from grpokit.kernels import attention
from grpokit.kernels.attention import NAME, gqa_sdpa, small_attention, small_attention_forward
from grpokit.rollout.engine import HFRolloutEngine
from grpokit.testing import build_tiny_causal_lm, build_word_tokenizer
from grpokit.train.learning import policy_logprobs as logprobs_module
from grpokit.train.learning.policy_logprobs import batched_logprobs, build_batch, completion_logprobs

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: see conftest.one_thread
CPU = torch.device("cpu")


class Heads(torch.nn.Module):
    """What the attention functions read from an HF attention module."""

    is_causal = True

    def __init__(self, heads, kv_heads):
        super().__init__()
        self.num_key_value_groups = heads // kv_heads


@pytest.fixture()
def calls(monkeypatch):
    """Counts of calls of the registered attention function, of those it sent to transformers' SDPA function
    ("sdpa"), and of those it sent to torch's SDPA with grouped-query attention ("gqa_sdpa")."""
    counts = {"interface": 0, "sdpa": 0, "gqa_sdpa": 0}

    def to_sdpa(*args, **kwargs):
        counts["sdpa"] += 1
        return sdpa_attention_forward(*args, **kwargs)

    def to_gqa_sdpa(*args, **kwargs):
        counts["gqa_sdpa"] += 1
        return gqa_sdpa(*args, **kwargs)

    def interface(*args, **kwargs):
        counts["interface"] += 1
        return small_attention_forward(*args, **kwargs)

    monkeypatch.setattr(attention, "sdpa_attention_forward", to_sdpa)
    monkeypatch.setattr(attention, "gqa_sdpa", to_gqa_sdpa)
    monkeypatch.setitem(AttentionInterface._global_mapping, NAME, interface)
    return counts


def test_by_hand():
    # one row, one head, head_dim 1, scaling 1: keys [0, 1], values [4, 8], queries [5, ln 3]
    # causal, no mask: query 0 sees key 0 only -> 4; query 1: scores [0, ln 3] -> softmax [1/4, 3/4] -> 1 + 6 = 7
    # mask [[F, F], [F, T]] (key 0 is left padding): query 0 sees nothing -> 0 (as SDPA); query 1 sees key 1 -> 8
    q = torch.tensor([5.0, torch.log(torch.tensor(3.0))]).view(1, 1, 2, 1)
    k = torch.tensor([0.0, 1.0]).view(1, 1, 2, 1)
    v = torch.tensor([4.0, 8.0]).view(1, 1, 2, 1)
    out, weights = small_attention_forward(Heads(1, 1), q, k, v, None, scaling=1.0)
    assert weights is None and out.shape == (1, 2, 1, 1)  # [b, q, heads, d]
    torch.testing.assert_close(out.flatten(), torch.tensor([4.0, 7.0]))
    mask = torch.tensor([[False, False], [False, True]]).view(1, 1, 2, 2)
    out, _ = small_attention_forward(Heads(1, 1), q, k, v, mask, scaling=1.0)
    torch.testing.assert_close(out.flatten(), torch.tensor([0.0, 8.0]))


def _mask(padding, q_len, kv_len):
    """HF's SDPA mask for ``q_len`` new tokens at the end of ``kv_len`` (a KV cache holds the rest)."""
    return sdpa_mask(
        batch_size=padding.size(0),
        q_length=q_len,
        kv_length=kv_len,
        q_offset=kv_len - q_len,
        attention_mask=padding,
        device=CPU,
    )


LEFT_PADDED = torch.tensor([[0, 0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1], [0, 0, 0, 0, 1, 1, 1]], dtype=torch.bool)
CASES = {
    # [prompt | completion] left-padded, run whole: rows' first query positions see no key at all
    "left_padded": lambda: (7, _mask(LEFT_PADDED, 7, 7)),
    # completions (4 tokens) on a shared prompt's KV cache (3 of 7 positions, left-padded): q_len < k_len
    "shared_prefix": lambda: (4, _mask(LEFT_PADDED, 4, 7)),
    "one_query": lambda: (1, _mask(LEFT_PADDED, 1, 7)),
    # no padding: HF passes no mask and SDPA's is_causal (q_len = k_len) or nothing (q_len = 1)
    "causal_no_mask": lambda: (7, None),
    "one_query_no_mask": lambda: (1, None),
}


@pytest.mark.parametrize("heads,kv_heads", [(8, 2), (4, 4)], ids=["gqa", "mha"])
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("budget", ["plain", "fallback"])
def test_equals_sdpa(case, heads, kv_heads, budget, calls, monkeypatch):
    q_len, mask = CASES[case]()
    if budget == "fallback":  # one byte short of this call's float32 probabilities [3, heads, q_len, 7]
        monkeypatch.setattr(attention, "PROBS_BUDGET", 3 * heads * q_len * 7 * 4 - 1)
    assert case.endswith("no_mask") == (mask is None)
    if case == "left_padded":
        assert not mask.any(-1).all()  # rows with every key masked are in the test
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(3, q_len, heads, 16, generator=gen).transpose(1, 2)  # HF's layout: [b, h, q, d] over [b, q, h, d]
    k, v = (torch.randn(3, 7, kv_heads, 16, generator=gen).transpose(1, 2) for _ in range(2))
    upstream = torch.randn(3, q_len, heads, 16, generator=gen)
    results = []
    for fn in (small_attention_forward, sdpa_attention_forward):
        leaves = [x.clone().requires_grad_(True) for x in (q, k, v)]
        out, weights = fn(Heads(heads, kv_heads), *leaves, mask, scaling=0.3)
        assert weights is None
        (out * upstream).sum().backward()
        results.append([out] + [x.grad for x in leaves])
    for got, expected, name in zip(*results, ["output", "dq", "dk", "dv"]):
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=0, msg=name)
    assert (calls["gqa_sdpa"], calls["sdpa"]) == (int(budget == "fallback"), 0)


def test_features_it_does_not_implement_go_to_sdpa(calls):
    q, k, v = torch.randn(1, 2, 3, 4), torch.randn(1, 2, 3, 4), torch.randn(1, 2, 3, 4)
    float_mask = torch.zeros(1, 1, 3, 3)  # an additive mask, not HF's boolean one
    small_attention_forward(Heads(2, 2), q, k, v, float_mask)
    small_attention_forward(Heads(2, 2), q, k, v, None, dropout=0.1)
    assert (calls["gqa_sdpa"], calls["sdpa"]) == (2, 0)  # torch's SDPA takes both
    with pytest.raises(ValueError, match="softcap"):  # transformers' answer
        small_attention_forward(Heads(2, 2), q, k, v, None, softcap=30.0)
    small_attention_forward(Heads(2, 2), q, k, v, None, output_attentions=True)
    assert (calls["gqa_sdpa"], calls["sdpa"]) == (2, 2)
    small_attention_forward(Heads(2, 2), q, k, v, None, sliding_window=None, dropout=0.0)
    assert (calls["gqa_sdpa"], calls["sdpa"]) == (2, 2)


@pytest.mark.parametrize("case", ["shared_prefix", "causal_no_mask", "one_query"])
def test_gqa_sdpa_keeps_unrepeated_keys_and_values_with_sdpas_numbers(case):
    """torch's grouped-query SDPA against transformers' (which repeats K/V per query head when there is a mask):
    the same output and query gradient, K/V gradients equal up to the order of the groups' sum, and K/V saved
    for the backward unrepeated."""
    q_len, mask = CASES[case]()
    heads, kv_heads, d = 8, 2, 16
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(3, heads, q_len, d, generator=gen)
    k, v = (torch.randn(3, kv_heads, 7, d, generator=gen) for _ in range(2))
    upstream = torch.randn(3, q_len, heads, d, generator=gen)
    results, saved = [], []
    for fn in (gqa_sdpa, sdpa_attention_forward):
        leaves = [x.clone().requires_grad_(True) for x in (q, k, v)]
        storages = {}

        def pack(t, storages=storages):
            storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out, _ = fn(Heads(heads, kv_heads), *leaves, mask, scaling=0.3)
        (out * upstream).sum().backward()
        results.append([out] + [x.grad for x in leaves])
        saved.append(sum(storages.values()))
    for got, expected, name in zip(*results, ["output", "dq", "dk", "dv"]):
        torch.testing.assert_close(got, expected, atol=1e-6, rtol=0, msg=name)
    if mask is not None and q_len > 1:  # repeated: K and V of 8 heads x 7 keys x 16 x 4 B each; unrepeated: of 2
        assert saved[1] - saved[0] == 3 * 2 * (heads - kv_heads) * 7 * d * 4
    else:  # no mask: transformers passes enable_gqa itself; one query: it folds the groups into the query
        assert saved[1] == saved[0]


@pytest.fixture(scope="module")
def setup():
    tokenizer = build_word_tokenizer([f"w{i}" for i in range(60)])
    model, _ = build_tiny_causal_lm(tokenizer=tokenizer, arch="qwen2", num_kv_heads=2)
    engine = HFRolloutEngine(model, list(range(2, 12)), tokenizer.pad_token_id, CPU, seed=3)
    rollouts = engine.generate(
        [[20, 21, 22], [30, 31, 32, 33, 34, 35, 36], [40]],
        4,
        sampling_params(max_completion_length=12, temperature=0.7),
    )
    assert len(set(rollouts.completion_lengths.tolist())) > 2  # ragged completions: padding inside micro-batches
    return model, build_batch(model, rollouts, tokenizer.pad_token_id, CPU)


def _learner_passes(model, batch):
    """Log-probs and entropy of rows 2-7 (parts of two groups) with the gradients of their sum, and the
    no-grad pass of the reference / old policy over all rows, as the learner runs them."""
    model.zero_grad()
    logprobs, entropy = completion_logprobs(model, batch.rows(slice(2, 7)), 0.7, with_entropy=True)
    assert model.config._attn_implementation == "sdpa"
    (
        logprobs * batch.completion_mask[2:7]
    ).sum().backward()  # after the switch's block: autograd replays the recorded ops
    grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad()
    return [logprobs.detach(), entropy, batched_logprobs(model, batch, 0.7, micro_batch_size=5)], grads


@pytest.mark.parametrize("layout", ["shared_prefix", "full_forward"])
def test_learner_logprobs_and_gradients_equal_sdpa(setup, layout, calls, monkeypatch):
    # full_forward: the [left-padded prompt | completion] layout of DDP / FSDP, whose pad rows see no key
    model, batch = setup
    if layout == "full_forward":
        monkeypatch.setattr(logprobs_module, "shares_prefix", lambda model: False)
    got, got_grads = _learner_passes(model, batch)
    assert calls["interface"] > 0 and calls["sdpa"] == 0  # the switch was on, and every call took the plain form
    monkeypatch.setattr(attention, "small_attention", lambda model: contextlib.nullcontext())  # the switch off
    calls["interface"] = 0
    expected, expected_grads = _learner_passes(model, batch)
    assert calls["interface"] == 0
    for a, b, name in zip(got, expected, ["logprobs", "entropy", "no-grad pass"]):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0, msg=name)
    for name, grad in expected_grads.items():
        torch.testing.assert_close(got_grads[name], grad, atol=1e-5 * grad.abs().max().item(), rtol=0, msg=name)


def test_bf16_autocast_logprobs_close_to_sdpa(setup, monkeypatch):
    # Tolerance: under bf16 autocast both forms round q k^T, the probabilities and the output to bf16 (8 mantissa
    # bits), in different orders. Stated bound: log-probs within 0.03 nats and gradients with cosine > 0.9999
    # (measured: 0.010 nats, cosine 0.99999; for scale, SDPA in bf16 vs float32 on this model: 0.0064 nats).
    model, batch = setup
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got, got_grads = _learner_passes(model, batch)
        monkeypatch.setattr(attention, "small_attention", lambda model: contextlib.nullcontext())
        expected, expected_grads = _learner_passes(model, batch)
    for a, b in zip(got, expected):
        assert (a - b).abs().max() < 0.03
    flat = lambda grads: torch.cat([g.flatten() for g in grads.values()])
    assert torch.cosine_similarity(flat(got_grads), flat(expected_grads), dim=0) > 0.9999


def test_switch_restores_the_implementation(setup):
    model, _ = setup
    with small_attention(model):
        assert model.config._attn_implementation == NAME
    assert model.config._attn_implementation == "sdpa"
    with pytest.raises(RuntimeError, match="inside"), small_attention(model):
        raise RuntimeError("inside")
    assert model.config._attn_implementation == "sdpa"


def test_switch_through_peft_and_left_alone_otherwise(setup):
    import peft

    model, _ = setup
    lora = peft.get_peft_model(copy.deepcopy(model), peft.LoraConfig(r=2, target_modules=["q_proj"]))
    with small_attention(lora):
        assert lora.get_base_model().config._attn_implementation == NAME
    assert lora.get_base_model().config._attn_implementation == "sdpa"
    eager = copy.deepcopy(model)
    eager.set_attn_implementation("eager")
    with small_attention(eager):
        assert eager.config._attn_implementation == "eager"
    with small_attention(torch.nn.Linear(2, 2)):  # a custom module: nothing to switch
        pass


def test_activation_checkpointing_keeps_sdpa(setup, calls):
    # checkpointing reruns each layer's forward during backward, after the block: had the switch been on,
    # the rerun (on SDPA) would save other tensors than the forward did, and torch refuses that (CheckpointError)
    model, batch = setup
    checkpointed = copy.deepcopy(model)
    (getattr(checkpointed, "activation_checkpointing_enable", None) or checkpointed.gradient_checkpointing_enable)()
    with small_attention(checkpointed):
        assert checkpointed.config._attn_implementation == "sdpa"
    logprobs, _ = completion_logprobs(checkpointed, batch.rows(slice(2, 7)), 0.7)
    logprobs.sum().backward()
    assert calls["interface"] == 0


def test_forward_only_calls_have_their_own_budget(calls, monkeypatch):
    # 1 row x 2 heads x 3 x 3 float32 probabilities = 72 bytes
    monkeypatch.setattr(attention, "NO_GRAD_PROBS_BUDGET", 71)
    q, k, v = (torch.randn(1, 2, 3, 4, requires_grad=True) for _ in range(3))
    small_attention_forward(Heads(2, 2), q, k, v, None)  # recorded by autograd: PROBS_BUDGET
    assert calls["gqa_sdpa"] == 0
    with torch.no_grad():
        small_attention_forward(Heads(2, 2), q, k, v, None)
    assert calls["gqa_sdpa"] == 1
    monkeypatch.setattr(attention, "NO_GRAD_PROBS_BUDGET", 72)
    with torch.no_grad():
        small_attention_forward(Heads(2, 2), q, k, v, None)
    assert (calls["gqa_sdpa"], calls["sdpa"]) == (1, 0)
