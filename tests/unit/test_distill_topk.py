"""The teacher's top-k term in the learner: the student's log-probs at given ids through the fused LM head equal
log_softmax of the full logits there, the term's gradient equals autograd's through the full logits, and the bucket
divergences equal numbers worked out by hand."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from shared_helpers import sampling_params

from grpokit.algos.distill import TeacherTopK, teacher_topk, topk_term
from grpokit.kernels import Kernels
from grpokit.kernels.gathered_head import gathered_logits
from grpokit.rollout.engine import HFRolloutEngine
from grpokit.testing import build_tiny_causal_lm, build_word_tokenizer
from grpokit.train.learning.distill_term import distill_term
from grpokit.train.learning.policy_logprobs import build_batch, completion_topk, fused_head

CPU = torch.device("cpu")
K = 4


@pytest.fixture(scope="module")
def setup():
    torch.manual_seed(0)
    tokenizer = build_word_tokenizer([f"w{i}" for i in range(20)])
    model, _ = build_tiny_causal_lm(None, tokenizer, hidden_size=32, num_layers=1, num_heads=2, seed=3)
    model = model.float()
    engine = HFRolloutEngine(model, [tokenizer.eos_token_id], tokenizer.pad_token_id, CPU, seed=0)
    rollouts = engine.generate([[4, 5, 6], [7, 8]], 3, sampling_params(max_completion_length=6))
    batch = build_batch(model, rollouts, tokenizer.pad_token_id, CPU)
    n, T = batch.completion_ids.shape
    at = torch.randint(0, model.config.vocab_size, (n, T, K), generator=torch.Generator().manual_seed(1))
    return model, batch, at


def kernels(fused: bool) -> Kernels:
    k = Kernels.select(CPU)
    return k if fused else dataclasses.replace(k, fused_decoder=False, fused_head=False, packed_linears=False)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_fused_topk_logprobs_equal_log_softmax_of_the_full_logits(setup, temperature):
    model, batch, at = setup
    assert fused_head(model, kernels(True)) is not None and fused_head(model, kernels(False)) is None
    with torch.no_grad():
        fast_lp, _, fast = completion_topk(model, batch, temperature, at, kernels=kernels(True))
        full_lp, _, full = completion_topk(model, batch, temperature, at, kernels=kernels(False))
    real = batch.completion_mask.bool()
    assert fast.shape == full.shape == (*batch.completion_ids.shape, K)
    assert torch.allclose(fast[real], full[real], atol=1e-6, rtol=0)
    assert torch.allclose(fast_lp[real], full_lp[real], atol=1e-6, rtol=0)
    assert not fast[~real].any()  # 0 past each completion


def teacher_of(at: torch.Tensor, seed: int = 2) -> TeacherTopK:
    """Teacher top-k log-probs at ``at`` from a random distribution over the ids (the tail: the rest of the mass)."""
    g = torch.Generator().manual_seed(seed)
    probs = torch.softmax(torch.randn(*at.shape[:-1], K + 1, generator=g), -1)  # k buckets and the tail
    return TeacherTopK(at, probs[..., :K].log(), probs[..., K].log())


@pytest.mark.parametrize("name", ["forward_kl_topk", "jsd"])
def test_the_terms_gradient_through_the_fused_head_equals_autograd_through_full_logits(setup, name):
    model, batch, at = setup
    at = torch.stack([torch.randperm(model.config.vocab_size)[:K] for _ in range(at[..., 0].numel())]).view_as(at)
    teacher, mask = teacher_of(at), batch.completion_mask.float()
    grads = {}
    for fused in (True, False):
        model.zero_grad(set_to_none=True)
        _, _, student = completion_topk(model, batch, 0.9, at, kernels=kernels(fused))
        term, metrics = distill_term(name, 0.5, teacher, student, mask, mask.sum())
        term.backward()
        grads[fused] = ({n: p.grad.clone() for n, p in model.named_parameters()}, float(term.detach()), metrics)
    (fast, fast_term, fast_metrics), (full, full_term, full_metrics) = grads[True], grads[False]
    assert fast_term == pytest.approx(full_term, abs=1e-6) and fast_term > 0
    assert fast_metrics[f"distill/{name}"] == pytest.approx(full_metrics[f"distill/{name}"], abs=1e-6)
    for key in full:
        assert torch.allclose(fast[key], full[key], atol=1e-6, rtol=1e-4), key
    assert any(g.abs().sum() > 0 for g in full.values())


def test_gathered_logits_and_their_gradients_equal_plain_autograd():
    g = torch.Generator().manual_seed(0)
    h = torch.randn(5, 8, generator=g, requires_grad=True)
    w = torch.randn(11, 8, generator=g, requires_grad=True)
    b = torch.randn(11, generator=g, requires_grad=True)
    ids = torch.randint(0, 11, (5, 3), generator=g)
    upstream = torch.randn(5, 3, generator=g)
    (gathered_logits(h, w, b, ids) * upstream).sum().backward()
    mine = h.grad.clone(), w.grad.clone(), b.grad.clone()
    h.grad = w.grad = b.grad = None
    ((h @ w.T + b).gather(1, ids) * upstream).sum().backward()
    for x, y in zip(mine, (h.grad, w.grad, b.grad)):
        assert torch.allclose(x, y, atol=1e-6)


def test_bucket_divergences_by_hand():
    # teacher buckets (0.5, 0.3 | tail 0.2); the student's at the same ids (0.25, 0.25), so its tail is 0.5
    teacher_top, tail = torch.tensor([0.5, 0.3]).log(), torch.tensor(0.2).log()
    student = torch.tensor([0.25, 0.25]).log()
    # KL(t || s) = .5 ln(.5/.25) + .3 ln(.3/.25) + .2 ln(.2/.5) = .346574 + .054696 - .183258 = .218012
    forward = 0.5 * math.log(2) + 0.3 * math.log(1.2) + 0.2 * math.log(0.4)
    assert forward == pytest.approx(0.218012, abs=1e-6)
    assert float(topk_term("forward_kl_topk", teacher_top, tail, student)) == pytest.approx(forward, abs=1e-6)
    # m = (.375, .275, .35); KL(t || m) = .058021, KL(s || m) = .053144; JSD = their mean = .055582
    m = (0.375, 0.275, 0.35)
    kl_tm = sum(p * math.log(p / q) for p, q in zip((0.5, 0.3, 0.2), m))
    kl_sm = sum(p * math.log(p / q) for p, q in zip((0.25, 0.25, 0.5), m))
    assert (kl_tm + kl_sm) / 2 == pytest.approx(0.055582, abs=1e-6)
    assert float(topk_term("jsd", teacher_top, tail, student)) == pytest.approx(0.055582, abs=1e-6)


def test_teacher_topk_keeps_the_exact_tail():
    logprobs = torch.tensor([0.05, 0.5, 0.15, 0.3]).log()
    ids, top, tail = teacher_topk(logprobs, 2)
    assert ids.tolist() == [1, 3]
    assert torch.allclose(top.exp(), torch.tensor([0.5, 0.3]))
    assert float(tail.exp()) == pytest.approx(0.2, abs=1e-7)  # 0.05 + 0.15
    # a top-k holding all but 4e-9 of the mass: log(1 - sum) rounds to log 0 in float32, the logsumexp does not
    sharp = torch.log_softmax(torch.tensor([20.0, 0.0, 0.0]), -1)
    assert float(teacher_topk(sharp, 1)[2]) == pytest.approx(math.log(2) - 20, abs=1e-4)


def test_steps_on_the_term_through_the_fused_head_lower_it(setup):
    """20 Adam steps on the forward_kl_topk term of one batch, through the fused head, cut it by more than half."""
    import copy

    model, batch, at = setup
    model = copy.deepcopy(model)
    at = torch.stack([torch.randperm(model.config.vocab_size)[:K] for _ in range(at[..., 0].numel())]).view_as(at)
    teacher, mask = teacher_of(at), batch.completion_mask.float()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    seen = []
    for _ in range(20):
        _, _, student = completion_topk(model, batch, 1.0, at, kernels=kernels(True))
        term, _ = distill_term("forward_kl_topk", 1.0, teacher, student, mask, mask.sum())
        optimizer.zero_grad(set_to_none=True)
        term.backward()
        optimizer.step()
        seen.append(float(term.detach()))
    assert seen[-1] < 0.5 * seen[0], seen
