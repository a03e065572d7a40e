import math

import pytest
import torch
from shared_helpers import loss_spec

from grpokit.algos import (
    aggregate,
    importance_log_ratio,
    kl_estimate,
    masked_mean,
    masked_sum,
    policy_loss,
)

LN2 = math.log(2.0)
CLIPPED = ("grpo", "bnpo", "dr_grpo", "dapo")  # the clipped surrogate under its four aggregations
# 2 sequences x 3 tokens, the last token of sequence 2 is padding
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])


# --- masked reductions and aggregation ---------------------------------------------------------


def test_masked_sum_and_mean():
    values = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    assert masked_sum(values, MASK).item() == 15.0  # 1+2+3+4+5
    assert masked_mean(values, MASK).item() == 3.0  # 15 / 5
    torch.testing.assert_close(masked_mean(values, MASK, dim=-1), torch.tensor([2.0, 4.5]))
    # an all-padding row counts as one token, giving 0 instead of NaN
    assert masked_mean(values, torch.zeros(2, 3), dim=-1).tolist() == [0.0, 0.0]
    assert masked_mean(values, MASK.bool()).item() == 3.0


def test_aggregate_each_loss_type_by_hand():
    values = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    # grpo: mean(mean(1,2,3), mean(4,5)) = mean(2, 4.5) = 3.25
    assert aggregate(values, MASK, "grpo").item() == pytest.approx(3.25)
    # bnpo: (1+2+3+4+5) / 5 = 3
    assert aggregate(values, MASK, "bnpo").item() == pytest.approx(3.0)
    # dapo: 15 / num_items_in_batch (whole generation batch: 10 tokens) = 1.5; without it like bnpo
    assert aggregate(values, MASK, "dapo", num_items_in_batch=10).item() == pytest.approx(1.5)
    assert aggregate(values, MASK, "dapo", num_items_in_batch=torch.tensor(10.0)).item() == pytest.approx(1.5)
    assert aggregate(values, MASK, "dapo").item() == pytest.approx(3.0)
    # dr_grpo: 15 / (2 sequences * 4 max tokens) = 1.875
    assert aggregate(values, MASK, "dr_grpo", max_completion_length=4).item() == pytest.approx(1.875)


def test_aggregate_errors():
    with pytest.raises(ValueError, match="max_completion_length"):
        aggregate(torch.ones(2, 3), MASK, "dr_grpo")
    with pytest.raises(ValueError, match="grpo, bnpo, dr_grpo, dapo"):
        aggregate(torch.ones(2, 3), MASK, "mean")


# --- KL estimators -----------------------------------------------------------------------------


def test_kl_estimators_by_hand():
    # d = ref - logp = [ln2, 0, -ln2]
    # k1 = -d = [-0.693147, 0, 0.693147]; k2 = d^2 / 2 = [0.240227, 0, 0.240227]
    # k3 = e^d - d - 1 = [2 - 0.693147 - 1, 0, 0.5 + 0.693147 - 1] = [0.306853, 0, 0.193147]
    logprobs = torch.zeros(1, 3)
    ref = torch.tensor([[LN2, 0.0, -LN2]])
    torch.testing.assert_close(kl_estimate(logprobs, ref, "k1"), torch.tensor([[-0.693147, 0.0, 0.693147]]))
    torch.testing.assert_close(kl_estimate(logprobs, ref, "k2"), torch.tensor([[0.240227, 0.0, 0.240227]]))
    torch.testing.assert_close(kl_estimate(logprobs, ref, "k3"), torch.tensor([[0.306853, 0.0, 0.193147]]))
    with pytest.raises(ValueError, match="k1, k2, k3"):
        kl_estimate(logprobs, ref, "k4")


@pytest.mark.parametrize("kind", ["k1", "k2", "k3"])
def test_kl_zero_for_identical_distributions(kind):
    logprobs = torch.randn(3, 5).log_softmax(-1)
    assert torch.equal(kl_estimate(logprobs, logprobs.clone(), kind), torch.zeros(3, 5))


# --- policy loss by hand -----------------------------------------------------------------------

# old = 0 and logp - old = log of these ratios; advantages [1, -1]; epsilon 0.2
RATIOS = torch.tensor([[1.0, 1.5, 0.5], [1.1, 0.7, 3.0]])
ADVANTAGES = torch.tensor([1.0, -1.0])
# per-token loss -min(r A, clip(r, 0.8, 1.2) A):
#   seq 1 (A = 1):  r=1 -> -1;  r=1.5 -> -min(1.5, 1.2) = -1.2;  r=0.5 -> -min(0.5, 0.8) = -0.5
#   seq 2 (A = -1): r=1.1 -> 1.1;  r=0.7 -> -min(-0.7, -0.8) = 0.8;  r=3 -> padding
# masked sum = -2.7 + 1.9 = -0.8 over 5 tokens
HAND_LOSS = {
    "grpo": (-2.7 / 3 + 1.9 / 2) / 2,  # mean(-0.9, 0.95) = 0.025
    "bnpo": -0.8 / 5,  # -0.16
    "dapo": -0.8 / 8,  # num_items_in_batch = 8 -> -0.1
    "dr_grpo": -0.8 / (2 * 5),  # max_completion_length = 5 -> -0.08
}
MAX_LEN = 5  # max_completion_length of dr_grpo
NUM_ITEMS = 8  # num_items_in_batch of dapo


def _hand_inputs(dtype=torch.float32):
    logprobs = RATIOS.log().to(dtype).requires_grad_(True)
    return logprobs, torch.zeros(2, 3, dtype=dtype)


@pytest.mark.parametrize("loss_type", CLIPPED)
def test_policy_loss_each_loss_type_by_hand(loss_type):
    logprobs, old = _hand_inputs()
    loss, metrics = policy_loss(
        logprobs,
        old,
        ADVANTAGES,
        MASK,
        loss_spec(loss_type=loss_type, max_completion_length=MAX_LEN),
        num_items_in_batch=NUM_ITEMS,
    )
    assert loss.item() == pytest.approx(HAND_LOSS[loss_type], abs=1e-6)
    assert metrics["policy_loss"] == pytest.approx(HAND_LOSS[loss_type], abs=1e-6)
    # low: r=0.7 < 0.8 with A < 0; high: r=1.5 > 1.2 with A > 0 (r=0.5, A>0 is not clipped;
    # r=3 is padding); each 1 of 5 tokens. ratio mean (1 + 1.5 + 0.5 + 1.1 + 0.7) / 5 = 0.96
    assert metrics["clip_ratio/low_mean"] == pytest.approx(0.2)
    assert metrics["clip_ratio/high_mean"] == pytest.approx(0.2)
    assert metrics["clip_ratio/region_mean"] == pytest.approx(0.4)
    assert metrics["ratio_mean"] == pytest.approx(0.96)
    assert "kl" not in metrics


def test_clipped_tokens_have_zero_gradient():
    logprobs, old = _hand_inputs()
    loss, _ = policy_loss(logprobs, old, ADVANTAGES, MASK, loss_spec(loss_type="bnpo"))
    loss.backward()
    # d/dlogp of -r A / 5 is -r A / 5 where the unclipped term is the min, else 0:
    #   [0,0] r=1, A=1: -0.2   [0,1] r=1.5 > 1.2, A>0: clipped -> 0   [0,2] r=0.5: -0.1
    #   [1,0] r=1.1, A=-1: 0.22   [1,1] r=0.7 < 0.8, A<0: clipped -> 0   [1,2] padding -> 0
    expected = torch.tensor([[-0.2, 0.0, -0.1], [0.22, 0.0, 0.0]])
    torch.testing.assert_close(logprobs.grad, expected)


def test_epsilon_high_widens_upper_clip():
    # epsilon_high = 0.6: r = 1.5 < 1.6 is no longer clipped, seq 1 becomes [-1, -1.5, -0.5];
    # bnpo: (-3 + 1.9) / 5 = -0.22, and nothing is high-clipped
    logprobs, old = _hand_inputs()
    loss, metrics = policy_loss(logprobs, old, ADVANTAGES, MASK, loss_spec(loss_type="bnpo", epsilon_high=0.6))
    assert loss.item() == pytest.approx(-0.22, abs=1e-6)
    assert metrics["clip_ratio/high_mean"] == 0.0
    assert metrics["clip_ratio/low_mean"] == pytest.approx(0.2)


def test_on_policy_old_none_gives_ratio_one_and_advantage_gradient():
    # ratio 1 everywhere: loss per token -A; bnpo: (-1 * 3 + 2 * 2) / 5 = 0.2; grad -A / 5
    logprobs = torch.randn(2, 3, requires_grad=True)
    loss, metrics = policy_loss(logprobs, None, torch.tensor([1.0, -2.0]), MASK, loss_spec(loss_type="bnpo"))
    assert loss.item() == pytest.approx(0.2)
    assert metrics["ratio_mean"] == 1.0
    loss.backward()
    torch.testing.assert_close(logprobs.grad, torch.tensor([[-0.2, -0.2, -0.2], [0.4, 0.4, 0.0]]))


def test_kl_penalty_by_hand():
    # advantages 0 -> surrogate 0; d = ref - logp: seq 1 [ln2, 0, -ln2], seq 2 [ln2, ln2, pad]
    # k3 = [0.306853, 0, 0.193147], [0.306853, 0.306853, -]; bnpo mean = 1.113706 / 5 = 0.222741
    # loss = beta * 0.222741 = 0.0222741 with beta = 0.1
    logprobs = torch.zeros(2, 3)
    ref = torch.tensor([[LN2, 0.0, -LN2], [LN2, LN2, 5.0]])
    loss, metrics = policy_loss(
        logprobs, None, torch.zeros(2), MASK, loss_spec(loss_type="bnpo", beta=0.1), ref_logprobs=ref
    )
    assert loss.item() == pytest.approx(0.0222741, abs=1e-6)
    assert metrics["kl"] == pytest.approx(0.222741, abs=1e-6)
    assert metrics["policy_loss"] == 0.0
    with pytest.raises(ValueError, match="ref_logprobs"):
        policy_loss(logprobs, None, torch.zeros(2), MASK, loss_spec(beta=0.1))


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_bias_corrected_kl_by_hand(level):
    # one token: logp = ln 0.5, old = ln 0.25 -> r = 2; ref = ln 0.25 -> d = ref - logp = -ln 2,
    # k3 = e^d - d - 1 = 0.5 + 0.693147 - 1 = 0.193147. A = 0 (no surrogate), beta = 1:
    # plain: loss = k3 = 0.193147, dloss/dlogp = 1 - e^d = 0.5
    # corrected: loss = r k3 = 0.386294, dloss/dlogp = r k3 + r (1 - e^d) = 0.386294 + 1 = 1.386294
    # (a single token: the sequence-level ratio is the same r)
    old, ref, mask = torch.tensor([[math.log(0.25)]]), torch.tensor([[math.log(0.25)]]), torch.ones(1, 1)
    expected = {False: (0.193147, 0.5), True: (0.386294, 1.386294)}
    for corrected, (value, grad) in expected.items():
        logprobs = torch.tensor([[math.log(0.5)]], requires_grad=True)
        loss, metrics = policy_loss(
            logprobs,
            old,
            torch.zeros(1),
            mask,
            loss_spec(loss_type="grpo", beta=1.0, use_bias_correction_kl=corrected, importance_sampling_level=level),
            ref_logprobs=ref,
        )
        loss.backward()
        assert loss.item() == pytest.approx(value, abs=1e-6)
        assert logprobs.grad.item() == pytest.approx(grad, abs=1e-6)
        assert metrics["kl"] == pytest.approx(0.193147, abs=1e-6)  # the metric is plain k3 either way


def test_gspo_sequence_ratio_on_ragged_mask():
    # log ratio seq 1 [0.3, -0.1, 0.1] -> mean 0.1; seq 2 [0.2, 0.4, pad=9] -> mean 0.3
    # r = [e^0.1, e^0.3] = [1.105171, 1.349859]; A = [1, 1], eps 0.2:
    # seq 1 loss -1.105171 per token, seq 2 clipped to -1.2 per token
    logprobs = torch.tensor([[0.3, -0.1, 0.1], [0.2, 0.4, 9.0]], requires_grad=True)
    old = torch.zeros(2, 3)
    log_ratio = importance_log_ratio(logprobs, old, MASK, "sequence")
    torch.testing.assert_close(log_ratio, torch.tensor([[0.1], [0.3]]))
    advantages = torch.ones(2)
    loss, metrics = policy_loss(
        logprobs, old, advantages, MASK, loss_spec(loss_type="grpo", importance_sampling_level="sequence")
    )
    assert loss.item() == pytest.approx((-1.105171 - 1.2) / 2, abs=1e-6)  # -1.152586
    loss, metrics = policy_loss(
        logprobs, old, advantages, MASK, loss_spec(loss_type="bnpo", importance_sampling_level="sequence")
    )
    assert loss.item() == pytest.approx((3 * -1.105171 + 2 * -1.2) / 5, abs=1e-6)  # -1.143103
    # one of two sequences is high-clipped; ratio mean over sequences (1.105171 + 1.349859) / 2
    assert metrics["clip_ratio/high_mean"] == pytest.approx(0.5)
    assert metrics["ratio_mean"] == pytest.approx(1.227515, abs=1e-6)
    loss.backward()
    # seq 2 is clipped -> no gradient; seq 1: d/dlogp_t of -(3/5) exp(mean_t) = -(3/5) r / 3 = -0.221034
    torch.testing.assert_close(logprobs.grad, torch.tensor([[-0.221034] * 3, [0.0] * 3]))


def test_per_token_advantages_by_hand():
    # PPO: one advantage per token. Token 0: r = 1.5, A = 1 -> min(1.5, clip 1.2) = 1.2, clipped (no gradient);
    # token 1: r = 1, A = -2 -> -2; token 2: padding. bnpo: -(1.2 + -2) / 2 = 0.4
    logprobs = torch.tensor([[math.log(1.5), 0.0, 7.0]], requires_grad=True)
    old = torch.zeros(1, 3)
    advantages = torch.tensor([[1.0, -2.0, 5.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    loss, metrics = policy_loss(logprobs, old, advantages, mask, loss_spec(loss_type="bnpo"))
    assert loss.item() == pytest.approx(0.4, abs=1e-6)
    assert metrics["clip_ratio/high_mean"] == pytest.approx(0.5)  # token 0 of 2
    loss.backward()
    # token 1: d/dlogp of -(r * A) / 2 = -A r / 2 = 1.0
    torch.testing.assert_close(logprobs.grad, torch.tensor([[0.0, 1.0, 0.0]]))
    # the same advantage on every token is the per-sequence loss
    logprobs = torch.tensor([[0.3, -0.1, 0.1], [0.2, 0.4, 9.0]])
    per_sequence = policy_loss(logprobs, torch.zeros(2, 3), torch.tensor([1.0, -1.0]), MASK, loss_spec())[0]
    per_token = policy_loss(logprobs, torch.zeros(2, 3), torch.tensor([[1.0] * 3, [-1.0] * 3]), MASK, loss_spec())[0]
    torch.testing.assert_close(per_token, per_sequence)


def test_per_token_advantages_refuse_a_sequence_level_ratio():
    logprobs, old = _hand_inputs()
    with pytest.raises(ValueError, match=r"per-token advantages \[N, T\] \(PPO\) cannot be used with .*'sequence'"):
        policy_loss(logprobs, old, torch.ones(MASK.shape), MASK, loss_spec(importance_sampling_level="sequence"))


def test_name_validation():
    logprobs, old = _hand_inputs()
    with pytest.raises(ValueError, match="grpo, bnpo, dr_grpo, dapo"):
        policy_loss(logprobs, old, ADVANTAGES, MASK, loss_spec(loss_type="ppo"))
    with pytest.raises(ValueError, match="token, sequence"):
        policy_loss(logprobs, old, ADVANTAGES, MASK, loss_spec(importance_sampling_level="sentence"))
    with pytest.raises(ValueError, match="max_completion_length"):
        policy_loss(logprobs, old, ADVANTAGES, MASK, loss_spec(loss_type="dr_grpo"))
    with pytest.raises(ValueError, match="advantages"):
        policy_loss(logprobs, old, ADVANTAGES[:, None], MASK, loss_spec())
    with pytest.raises(ValueError, match="completion_mask"):
        policy_loss(logprobs, old, ADVANTAGES, MASK[:, :2], loss_spec())


# --- equivalence with a per-element reference loop --------------------------------------------


def _reference_loss(logprobs, old, ref, advantages, mask, loss_type, level, eps_low, eps_high, beta, n_items, max_len):
    """Slow per-element python version of the same formulas."""
    lp, ol, rf, m = logprobs.tolist(), old.tolist(), ref.tolist(), mask.tolist()
    n, t = len(lp), len(lp[0])
    per_token = [[0.0] * t for _ in range(n)]
    for i in range(n):
        count = sum(m[i])
        seq_log_ratio = sum((lp[i][j] - ol[i][j]) * m[i][j] for j in range(t)) / max(count, 1.0)
        for j in range(t):
            ratio = math.exp(seq_log_ratio if level == "sequence" else lp[i][j] - ol[i][j])
            clipped = min(max(ratio, 1 - eps_low), 1 + eps_high)
            a = advantages[i].item()
            loss = -min(ratio * a, clipped * a)
            d = rf[i][j] - lp[i][j]
            per_token[i][j] = loss + beta * (math.exp(d) - d - 1)
    total = sum(per_token[i][j] * m[i][j] for i in range(n) for j in range(t))
    tokens = sum(sum(row) for row in m)
    if loss_type == "grpo":
        return sum(sum(per_token[i][j] * m[i][j] for j in range(t)) / max(sum(m[i]), 1.0) for i in range(n)) / n
    if loss_type == "bnpo":
        return total / tokens
    if loss_type == "dapo":
        return total / n_items
    return total / (n * max_len)


def _random_batch(seed, n=6, t=7, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    logprobs = -torch.rand(n, t, generator=gen, dtype=dtype) * 3
    old = logprobs + 0.4 * torch.randn(n, t, generator=gen, dtype=dtype)  # ratios well past 1 +- eps
    ref = logprobs + 0.5 * torch.randn(n, t, generator=gen, dtype=dtype)
    advantages = torch.randn(n, generator=gen, dtype=dtype)
    lengths = torch.randint(1, t + 1, (n,), generator=gen)
    mask = (torch.arange(t)[None, :] < lengths[:, None]).to(dtype)  # [N, T] ragged
    return logprobs, old, ref, advantages, mask


@pytest.mark.parametrize("loss_type", CLIPPED)
@pytest.mark.parametrize("level", ["token", "sequence"])
def test_matches_reference_loop(loss_type, level):
    for seed in range(3):
        logprobs, old, ref, advantages, mask = _random_batch(seed, dtype=torch.float64)
        spec = loss_spec(
            loss_type=loss_type,
            epsilon=0.2,
            epsilon_high=0.28,
            beta=0.04,
            importance_sampling_level=level,
            max_completion_length=9,
        )
        loss, metrics = policy_loss(logprobs, old, advantages, mask, spec, ref_logprobs=ref, num_items_in_batch=37)
        expected = _reference_loss(logprobs, old, ref, advantages, mask, loss_type, level, 0.2, 0.28, 0.04, 37, 9)
        assert loss.item() == pytest.approx(expected, rel=1e-10, abs=1e-12)
        assert 0.0 <= metrics["clip_ratio/region_mean"] <= 1.0


@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("loss_type", ["grpo", "dapo"])
def test_gradcheck(level, loss_type):
    logprobs, old, ref, advantages, mask = _random_batch(7, n=4, t=5, dtype=torch.float64)
    logprobs.requires_grad_(True)

    def loss_of(lp):
        loss, _ = policy_loss(
            lp,
            old,
            advantages,
            mask,
            loss_spec(loss_type=loss_type, epsilon=0.2, epsilon_high=0.3, beta=0.1, importance_sampling_level=level),
            ref_logprobs=ref,
            num_items_in_batch=20,
        )
        return loss

    assert torch.autograd.gradcheck(loss_of, (logprobs,))
