"""On-policy distillation's math (grpokit/algos/distill.py) against numbers worked out by hand."""

import math

import pytest
import torch

from grpokit.algos.distill import (
    distill_advantages,
    jsd,
    kl,
    sampled_reverse_kl,
    shared_vocab,
    tempered_logprobs,
    topk_buckets,
    topk_divergence,
)

LN2, LN3, LN4 = math.log(2.0), math.log(3.0), math.log(4.0)


def test_reverse_kl_of_two_coins_by_hand():
    # student p = [0.5, 0.5], teacher q = [0.75, 0.25]:
    # KL(p || q) = 0.5 ln(0.5/0.75) + 0.5 ln(0.5/0.25) = 0.5 (-0.405465) + 0.5 (0.693147) = 0.143841
    # KL(q || p) = 0.75 ln(1.5) + 0.25 ln(0.5) = 0.304099 - 0.173287 = 0.130812
    p = torch.tensor([0.5, 0.5]).log()
    q = torch.tensor([0.75, 0.25]).log()
    assert kl(p, q).item() == pytest.approx(0.143841, abs=1e-6)
    assert kl(q, p).item() == pytest.approx(0.130812, abs=1e-6)


def test_the_sampled_estimate_averages_to_the_reverse_kl():
    # E_{y ~ p}[log p(y) - log q(y)] = KL(p || q): the per-token term is its one-sample estimate.
    # Token 0: ln 0.5 - ln 0.75 = -0.405465; token 1: ln 0.5 - ln 0.25 = 0.693147; mean 0.143841.
    p = torch.tensor([0.5, 0.5]).log()
    q = torch.tensor([0.75, 0.25]).log()
    per_token = sampled_reverse_kl(p, q)
    torch.testing.assert_close(per_token, torch.tensor([-0.405465, 0.693147]))
    assert (per_token * p.exp()).sum().item() == pytest.approx(kl(p, q).item(), abs=1e-6)


def test_jsd_by_hand():
    # p = [1, 0], q = [0, 1]: m = [0.5, 0.5]; KL(p || m) = ln 2 = KL(q || m); JSD = ln 2 = 0.693147
    # p = q: 0
    p = torch.tensor([1.0, 1e-30]).log()
    q = torch.tensor([1e-30, 1.0]).log()
    assert jsd(p, q).item() == pytest.approx(LN2, abs=1e-6)
    assert jsd(p, p).item() == pytest.approx(0.0, abs=1e-7)


def test_distill_advantages_by_hand():
    # A = [1, -1] per sequence, lambda 0.5; student log-probs [[-1, -2], [-1, -1]], teacher [[-1, -1], [-3, -1]]:
    # s - t = [[0, -1], [2, 0]]; A_t = A - 0.5 (s - t) = [[1, 1.5], [-2, -1]], the mask zeroes row 1's last token.
    advantages = torch.tensor([1.0, -1.0])
    student = torch.tensor([[-1.0, -2.0], [-1.0, -1.0]])
    teacher = torch.tensor([[-1.0, -1.0], [-3.0, -1.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    out = distill_advantages(advantages, student, teacher, mask, 0.5)
    torch.testing.assert_close(out, torch.tensor([[1.0, 1.5], [-2.0, 0.0]]))
    # pure distillation: no reward advantage (all zero), the term alone
    alone = distill_advantages(torch.zeros(2), student, teacher, mask, 1.0)
    torch.testing.assert_close(alone, torch.tensor([[0.0, 1.0], [-2.0, 0.0]]))
    # per-token advantages [N, T] are added to token by token
    per_token = distill_advantages(torch.ones(2, 2), student, teacher, mask, 1.0)
    torch.testing.assert_close(per_token, torch.tensor([[1.0, 2.0], [-1.0, 0.0]]))


def test_topk_with_a_tail_bucket_by_hand():
    # teacher q = [0.5, 0.25, 0.125, 0.125], student p = [0.25, 0.25, 0.25, 0.25]; k = 2: the teacher's top 2 are
    # ids 0, 1; buckets q = [0.5, 0.25, tail 0.25], p = [0.25, 0.25, tail 0.5].
    # KL(p || q) = 0.25 ln(0.5) + 0.25 ln 1 + 0.5 ln 2 = -0.173287 + 0.346574 = 0.173287
    # KL(q || p) = 0.5 ln 2 + 0 + 0.25 ln 0.5 = 0.346574 - 0.173287 = 0.173287
    # full-vocabulary KL(p || q) = 0.25 (ln .5 + 0 + ln 2 + ln 2) = 0.25 ln 2 = 0.173287 (equal here: the tail's two
    # ids have the same ratio), and never below the bucketed one.
    q = torch.tensor([0.5, 0.25, 0.125, 0.125]).log()
    p = torch.tensor([0.25, 0.25, 0.25, 0.25]).log()
    t, s = topk_buckets(q, p, 2)
    torch.testing.assert_close(t.exp(), torch.tensor([0.5, 0.25, 0.25]))
    torch.testing.assert_close(s.exp(), torch.tensor([0.25, 0.25, 0.5]))
    assert topk_divergence("reverse_kl", q, p, 2).item() == pytest.approx(0.173287, abs=1e-6)
    assert topk_divergence("forward_kl_topk", q, p, 2).item() == pytest.approx(0.173287, abs=1e-6)
    assert topk_divergence("reverse_kl", q, p, 4).item() == pytest.approx(kl(p, q).item(), abs=1e-6)


def test_topk_is_a_lower_bound_never_negative():
    # data-processing inequality: merging ids into a tail can only lower a KL, and it stays >= 0 (no clamp needed)
    gen = torch.Generator().manual_seed(0)
    q = tempered_logprobs(3 * torch.randn(64, 50, generator=gen), 1.0)
    p = tempered_logprobs(3 * torch.randn(64, 50, generator=gen), 1.0)
    for k in (1, 5, 20):
        for name, full in (("reverse_kl", kl(p, q)), ("forward_kl_topk", kl(q, p))):
            bucketed = topk_divergence(name, q, p, k)
            assert (bucketed >= -1e-6).all()
            assert (bucketed <= full + 1e-5).all()


def test_topk_gradient_reaches_the_student():
    q = torch.tensor([0.5, 0.25, 0.125, 0.125]).log()
    logits = torch.zeros(4, requires_grad=True)
    topk_divergence("jsd", q, tempered_logprobs(logits, 1.0), 2).backward()
    assert logits.grad is not None and logits.grad.abs().sum() > 0


def test_temperature_and_padded_vocabulary_by_hand():
    # logits [0, 2 ln 3, 7, 7] from a teacher padded to 4 ids; the student has 2: sliced to [0, 2 ln 3];
    # at temperature 2 -> [0, ln 3] -> p = [0.25, 0.75]; at temperature 1 -> [1/10, 9/10]
    logits = torch.tensor([0.0, 2 * LN3, 7.0, 7.0])
    shared = shared_vocab(logits, 2)
    torch.testing.assert_close(tempered_logprobs(shared, 2.0).exp(), torch.tensor([0.25, 0.75]))
    torch.testing.assert_close(tempered_logprobs(shared, 1.0).exp(), torch.tensor([0.1, 0.9]))
    with pytest.raises(ValueError, match="fewer than the student's"):
        shared_vocab(logits, 5)


def test_unknown_loss_is_refused():
    q = torch.tensor([0.5, 0.5]).log()
    with pytest.raises(ValueError, match="valid values are reverse_kl, forward_kl_topk, jsd"):
        topk_divergence("k3", q, q, 1)
    assert topk_divergence("jsd", q, q, 1).item() == pytest.approx(0.0, abs=1e-7)
    assert kl(torch.full((4,), -LN4), torch.full((4,), -LN4)).item() == pytest.approx(0.0, abs=1e-7)
