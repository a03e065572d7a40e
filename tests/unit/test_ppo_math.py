"""PPO's pure math (algos/gae.py, algos/value.py) against hand-worked numbers and slow loop versions."""

from __future__ import annotations

import math

import pytest
import torch

from grpokit.algos.gae import (
    gae_advantages,
    kl_in_reward,
    last_token_rewards,
    masked_var,
    masked_whiten,
    ppo_advantages,
)
from grpokit.algos.value import explained_variance, value_loss

FULL = torch.tensor([[1.0, 1.0, 1.0]])
REWARDS_AT_END = torch.tensor([[0.0, 0.0, 1.0]])
VALUES = torch.tensor([[0.5, 0.6, 0.7]])


def test_last_token_rewards_by_hand():
    rewards = torch.tensor([1.0, -2.0, 0.5])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0], [0, 0, 0]])
    # the reward sits on token |o_i| - 1; the empty third row gets nothing
    expected = torch.tensor([[0.0, 0.0, 1.0], [-2.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    assert torch.equal(last_token_rewards(rewards, mask), expected)
    # a mask with a hole (a masked-out token inside the completion): still the last masked-in token
    holes = torch.tensor([[1, 0, 1, 0], [0, 1, 0, 0]])
    expected = torch.tensor([[0.0, 0.0, 3.0, 0.0], [0.0, 4.0, 0.0, 0.0]])
    assert torch.equal(last_token_rewards(torch.tensor([3.0, 4.0]), holes), expected)


def test_last_token_rewards_refuses_nan_and_bad_shapes():
    with pytest.raises(ValueError, match="NaN"):
        last_token_rewards(torch.tensor([1.0, float("nan")]), torch.ones(2, 3))
    with pytest.raises(ValueError, match=r"rewards must be \[N\]"):
        last_token_rewards(torch.tensor([1.0, 2.0, 3.0]), torch.ones(2, 3))


def test_kl_in_reward_by_hand():
    token_rewards = torch.tensor([[0.0, 1.0, 0.0]])
    logprobs = torch.tensor([[-1.0, -0.5, -2.0]])
    ref_logprobs = torch.tensor([[-1.5, -0.5, -1.0]])
    mask = torch.tensor([[1, 1, 0]])
    # k1 = logprobs - ref = [0.5, 0, -1.0], masked -> [0.5, 0, 0]; beta 0.1: r - 0.1 * kl = [-0.05, 1.0, 0]
    rewards, kl = kl_in_reward(token_rewards, logprobs, ref_logprobs, mask, beta=0.1)
    torch.testing.assert_close(kl, torch.tensor([[0.5, 0.0, 0.0]]))
    torch.testing.assert_close(rewards, torch.tensor([[-0.05, 1.0, 0.0]]))
    # k3 of d = ref - logp = -0.5 on token 0: exp(-0.5) + 0.5 - 1 = 0.1065307
    _, kl3 = kl_in_reward(token_rewards, logprobs, ref_logprobs, mask, beta=0.1, kind="k3")
    torch.testing.assert_close(kl3, torch.tensor([[math.exp(-0.5) - 0.5, 0.0, 0.0]]))


def test_gae_gamma_1_by_hand():
    # rewards [0, 0, 1], V = [0.5, 0.6, 0.7], gamma 1, lambda 0.95 (V after the end = 0):
    # delta = [0 + 0.6 - 0.5, 0 + 0.7 - 0.6, 1 + 0 - 0.7] = [0.1, 0.1, 0.3]
    # A_2 = 0.3; A_1 = 0.1 + 0.95 * 0.3 = 0.385; A_0 = 0.1 + 0.95 * 0.385 = 0.46575
    # returns = A + V = [0.96575, 0.985, 1.0]
    advantages, returns = gae_advantages(REWARDS_AT_END, VALUES, FULL, gamma=1.0, lam=0.95)
    torch.testing.assert_close(advantages, torch.tensor([[0.46575, 0.385, 0.3]]))
    torch.testing.assert_close(returns, torch.tensor([[0.96575, 0.985, 1.0]]))


def test_gae_gamma_09_by_hand():
    # gamma 0.9, lambda 0.95 (gamma * lambda = 0.855):
    # delta = [0.9 * 0.6 - 0.5, 0.9 * 0.7 - 0.6, 1 - 0.7] = [0.04, 0.03, 0.3]
    # A_2 = 0.3; A_1 = 0.03 + 0.855 * 0.3 = 0.2865; A_0 = 0.04 + 0.855 * 0.2865 = 0.2849575
    # returns = [0.7849575, 0.8865, 1.0]
    advantages, returns = gae_advantages(REWARDS_AT_END, VALUES, FULL, gamma=0.9, lam=0.95)
    torch.testing.assert_close(advantages, torch.tensor([[0.2849575, 0.2865, 0.3]]))
    torch.testing.assert_close(returns, torch.tensor([[0.7849575, 0.8865, 1.0]]))


def test_gae_right_padding_by_hand():
    # mask [1, 1, 0]: the reward 1 is on token 1 and the padding's value 9 must not leak in.
    # delta_1 = 1 + 0 - 0.6 = 0.4 = A_1; delta_0 = 0.9 * 0.6 - 0.5 = 0.04; A_0 = 0.04 + 0.855 * 0.4 = 0.382
    # returns = [0.882, 1.0, 0] (0 at padding)
    rewards = torch.tensor([[0.0, 1.0, 0.0]])
    values = torch.tensor([[0.5, 0.6, 9.0]])
    advantages, returns = gae_advantages(rewards, values, torch.tensor([[1, 1, 0]]), gamma=0.9, lam=0.95)
    torch.testing.assert_close(advantages, torch.tensor([[0.382, 0.4, 0.0]]))
    torch.testing.assert_close(returns, torch.tensor([[0.882, 1.0, 0.0]]))


def test_gae_lambda_0_and_1_are_td_and_monte_carlo():
    # lambda 0: A_t = delta_t (one-step TD); lambda 1, gamma 1: A_t = sum of future rewards - V_t
    a_td, _ = gae_advantages(REWARDS_AT_END, VALUES, FULL, gamma=1.0, lam=0.0)
    torch.testing.assert_close(a_td, torch.tensor([[0.1, 0.1, 0.3]]))
    a_mc, returns = gae_advantages(REWARDS_AT_END, VALUES, FULL, gamma=1.0, lam=1.0)
    torch.testing.assert_close(a_mc, torch.tensor([[0.5, 0.4, 0.3]]))
    torch.testing.assert_close(returns, torch.ones(1, 3))


def slow_gae(rewards, values, mask, gamma, lam):
    """A_t = sum_l (gamma lam)^l delta_{t+l} over each row's masked-in tokens, as plain Python sums."""
    advantages = torch.zeros_like(values, dtype=torch.float64)
    for i in range(values.size(0)):
        idx = [t for t in range(values.size(1)) if mask[i, t]]
        r = [float(rewards[i, t]) for t in idx]
        v = [float(values[i, t]) for t in idx] + [0.0]
        delta = [r[k] + gamma * v[k + 1] - v[k] for k in range(len(idx))]
        for k, t in enumerate(idx):
            advantages[i, t] = sum((gamma * lam) ** j * delta[k + j] for j in range(len(idx) - k))
    returns = (advantages + values.double()) * mask.double()
    return advantages, returns


@pytest.mark.parametrize("right_padded", [True, False])
@pytest.mark.parametrize(("gamma", "lam"), [(1.0, 0.95), (0.9, 0.95), (0.99, 1.0), (1.0, 0.0)])
def test_gae_matches_slow_loop_on_random_batches(gamma, lam, right_padded):
    generator = torch.Generator().manual_seed(int(gamma * 100 + lam * 10) + right_padded)
    N, T = 7, 9
    if right_padded:
        lengths = torch.randint(0, T + 1, (N,), generator=generator)
        mask = (torch.arange(T)[None] < lengths[:, None]).long()
    else:  # masked-out tokens inside a sequence (e.g. tool output) are skipped
        mask = (torch.rand(N, T, generator=generator) < 0.7).long()
    values = torch.randn(N, T, generator=generator, dtype=torch.float64)
    rewards = last_token_rewards(torch.randn(N, generator=generator, dtype=torch.float64), mask)
    rewards = rewards + 0.1 * torch.randn(N, T, generator=generator, dtype=torch.float64) * mask  # a KL term
    advantages, returns = gae_advantages(rewards, values, mask, gamma, lam)
    expected_advantages, expected_returns = slow_gae(rewards, values, mask, gamma, lam)
    torch.testing.assert_close(advantages, expected_advantages)
    torch.testing.assert_close(returns, expected_returns)


def test_gae_refuses_mismatched_shapes():
    with pytest.raises(ValueError, match="same"):
        gae_advantages(torch.zeros(2, 3), torch.zeros(2, 4), torch.ones(2, 3), 1.0, 0.95)


WHITEN_VALUES = torch.tensor([[1.0, 2.0, 3.0], [4.0, 9.0, 9.0]])
WHITEN_MASK = torch.tensor([[1, 1, 1], [1, 0, 0]])


def test_masked_whiten_by_hand():
    # masked-in: 1, 2, 3, 4 -> mean 2.5; squared deviations 2.25 + 0.25 + 0.25 + 2.25 = 5; unbiased var 5/3,
    # std 1.2909944: whitened [-1.1618950, -0.3872983, 0.3872983, 1.1618950], 0 at padding
    torch.testing.assert_close(masked_var(WHITEN_VALUES, WHITEN_MASK), torch.tensor(5.0 / 3.0))
    expected = torch.tensor([[-1.1618950, -0.3872983, 0.3872983], [1.1618950, 0.0, 0.0]])
    torch.testing.assert_close(masked_whiten(WHITEN_VALUES, WHITEN_MASK), expected)
    # shift_mean=False adds the mean 2.5 back on the masked-in elements
    shifted = torch.tensor([[1.3381050, 2.1127017, 2.8872983], [3.6618950, 0.0, 0.0]])
    torch.testing.assert_close(masked_whiten(WHITEN_VALUES, WHITEN_MASK, shift_mean=False), shifted)


@pytest.mark.parametrize("shift_mean", [True, False])
def test_masked_whiten_matches_slow_loop(shift_mean):
    generator = torch.Generator().manual_seed(3)
    values = 3.0 + 2.0 * torch.randn(6, 8, generator=generator, dtype=torch.float64)
    mask = (torch.rand(6, 8, generator=generator) < 0.6).long()
    picked = [float(values[i, t]) for i in range(6) for t in range(8) if mask[i, t]]
    mean = sum(picked) / len(picked)
    var = sum((x - mean) ** 2 for x in picked) / (len(picked) - 1)
    expected = torch.zeros_like(values)
    for i in range(6):
        for t in range(8):
            if mask[i, t]:
                expected[i, t] = (float(values[i, t]) - mean) / math.sqrt(var + 1e-8) + (0.0 if shift_mean else mean)
    torch.testing.assert_close(masked_whiten(values, mask, shift_mean=shift_mean), expected)


def test_masked_whiten_needs_two_tokens():
    with pytest.raises(ValueError, match="at least 2"):
        masked_whiten(torch.ones(1, 3), torch.tensor([[1, 0, 0]]))


# Value loss, cliprange_value 0.1:
#   token 0: V 1.0, old 0.8, R 1.5: V clipped to 0.9; errors 0.25 vs 0.36 -> 0.36 (clipped term used)
#   token 1: V 0.5, old 0.5, R 0.0: errors 0.25 vs 0.25 -> 0.25 (tie: not counted as clipped)
#   token 2: V 2.0, old 1.0, R 1.2: V clipped to 1.1; errors 0.64 vs 0.01 -> 0.64
# one row: bnpo = 0.5 * (0.36 + 0.25 + 0.64) / 3 = 0.2083333, clip fraction 1/3
V = torch.tensor([[1.0, 0.5, 2.0]])
OLD_V = torch.tensor([[0.8, 0.5, 1.0]])
RETURNS = torch.tensor([[1.5, 0.0, 1.2]])


def test_value_loss_by_hand():
    loss, metrics = value_loss(V, OLD_V, RETURNS, FULL, cliprange_value=0.1)
    torch.testing.assert_close(loss, torch.tensor(0.2083333))
    assert metrics["value_loss"] == pytest.approx(0.2083333, abs=1e-6)
    assert metrics["value_clip_frac"] == pytest.approx(1 / 3)
    # vf_coef scales the loss only, not the logged value loss
    scaled, metrics = value_loss(V, OLD_V, RETURNS, FULL, cliprange_value=0.1, vf_coef=0.5)
    torch.testing.assert_close(scaled, torch.tensor(0.1041667))
    assert metrics["value_loss"] == pytest.approx(0.2083333, abs=1e-6)


def test_value_loss_gradient_by_hand():
    # token 0 is clipped (constant 0.9): no gradient; token 1 (tie): 2 (V - R) = 1.0; token 2: 2 (2.0 - 1.2) = 1.6;
    # times 0.5 / 3 tokens: [0, 0.1666667, 0.2666667]
    values = V.clone().requires_grad_(True)
    loss, _ = value_loss(values, OLD_V, RETURNS, FULL, cliprange_value=0.1)
    loss.backward()
    torch.testing.assert_close(values.grad, torch.tensor([[0.0, 0.1666667, 0.2666667]]))


def test_value_loss_aggregations_by_hand():
    # a second row with one real token: V 5, old 5, R 3 -> error 4 (its padding holds junk)
    values = torch.cat([V, torch.tensor([[5.0, 7.0, 7.0]])])
    old_values = torch.cat([OLD_V, torch.tensor([[5.0, 0.0, 0.0]])])
    returns = torch.cat([RETURNS, torch.tensor([[3.0, 0.0, 0.0]])])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    # bnpo: 0.5 * (1.25 + 4) / 4 tokens = 0.65625; clip fraction 1/4
    loss, metrics = value_loss(values, old_values, returns, mask, 0.1, loss_type="bnpo")
    torch.testing.assert_close(loss, torch.tensor(0.65625))
    assert metrics["value_clip_frac"] == pytest.approx(0.25)
    # grpo: 0.5 * mean(1.25 / 3, 4 / 1) = 0.5 * 2.2083333 = 1.1041667
    loss, _ = value_loss(values, old_values, returns, mask, 0.1, loss_type="grpo")
    torch.testing.assert_close(loss, torch.tensor(1.1041667))
    # dapo over 10 tokens of the whole batch: 0.5 * 5.25 / 10 = 0.2625; dr_grpo: 0.5 * 5.25 / (2 * 3) = 0.4375
    loss, _ = value_loss(values, old_values, returns, mask, 0.1, loss_type="dapo", num_items_in_batch=10)
    torch.testing.assert_close(loss, torch.tensor(0.2625))
    loss, _ = value_loss(values, old_values, returns, mask, 0.1, loss_type="dr_grpo", max_completion_length=3)
    torch.testing.assert_close(loss, torch.tensor(0.4375))


def test_value_loss_refuses_bad_input():
    with pytest.raises(ValueError, match="cliprange_value"):
        value_loss(V, OLD_V, RETURNS, FULL, cliprange_value=0.0)
    with pytest.raises(ValueError, match="same"):
        value_loss(V, OLD_V, RETURNS[:, :2], FULL, cliprange_value=0.2)


def test_explained_variance_by_hand():
    # masked-in returns [1, 2, 3, 4] (var 5/3), values [1, 2, 3, 2]: residuals [0, 0, 0, 2],
    # mean 0.5, var (3 * 0.25 + 2.25) / 3 = 1; EV = 1 - 1 / (5/3 + 1e-5) = 0.4000036
    returns = torch.tensor([[1.0, 2.0, 3.0], [4.0, 50.0, 50.0]])
    values = torch.tensor([[1.0, 2.0, 3.0], [2.0, -50.0, -50.0]])
    ev = explained_variance(values, returns, WHITEN_MASK)
    assert float(ev) == pytest.approx(1 - 1 / (5 / 3 + 1e-5), abs=1e-6)
    assert float(explained_variance(returns, returns, WHITEN_MASK)) == pytest.approx(1.0)
    assert math.isnan(float(explained_variance(values, returns, torch.tensor([[1, 0, 0], [0, 0, 0]]))))


def test_ppo_advantages_by_hand():
    # reward 1 on token 2; k1 = logprobs - ref = [0.1, 0.2, 0.3], beta 0.5: token rewards [-0.05, -0.1, 0.85]
    # gamma 1, lambda 0.95, V = [0.5, 0.6, 0.7]: delta = [-0.05 + 0.1, -0.1 + 0.1, 0.85 - 0.7] = [0.05, 0, 0.15]
    # A_2 = 0.15; A_1 = 0 + 0.95 * 0.15 = 0.1425; A_0 = 0.05 + 0.95 * 0.1425 = 0.185375
    # returns = [0.685375, 0.7425, 0.85]
    logprobs = torch.tensor([[-1.0, -1.0, -1.0]])
    ref_logprobs = torch.tensor([[-1.1, -1.2, -1.3]])
    kwargs = dict(old_logprobs=logprobs, ref_logprobs=ref_logprobs, beta=0.5)
    advantages, returns, kl = ppo_advantages(
        torch.tensor([1.0]), VALUES, FULL, 1.0, 0.95, whiten_advantages=False, **kwargs
    )
    torch.testing.assert_close(kl, torch.tensor([[0.1, 0.2, 0.3]]))
    torch.testing.assert_close(advantages, torch.tensor([[0.185375, 0.1425, 0.15]]))
    torch.testing.assert_close(returns, torch.tensor([[0.685375, 0.7425, 0.85]]))
    # whitened: mean 0.1592917, unbiased var 0.0005243177, sqrt(var + 1e-8) = 0.0228982
    # -> [1.1390996, -0.7333181, -0.4057815]; the returns are not whitened
    advantages, whitened_returns, _ = ppo_advantages(torch.tensor([1.0]), VALUES, FULL, 1.0, 0.95, **kwargs)
    torch.testing.assert_close(advantages, torch.tensor([[1.1390996, -0.7333181, -0.4057815]]))
    torch.testing.assert_close(whitened_returns, returns)
    # without a reference (or beta 0) there is no KL term: the GAE example above
    advantages, _, kl = ppo_advantages(torch.tensor([1.0]), VALUES, FULL, 1.0, 0.95, whiten_advantages=False)
    assert kl is None
    torch.testing.assert_close(advantages, torch.tensor([[0.46575, 0.385, 0.3]]))


def test_ppo_advantages_whiten_rewards_and_errors():
    # whiten_rewards (TRL's option) scales the token rewards [[0, 1], [0, 3]] without shifting them:
    # mean 1, unbiased var (1 + 0 + 1 + 4) / 3 = 2, (x - 1) / sqrt(2) + 1 -> [[0.2928932, 1], [0.2928932, 2.4142136]]
    # gamma 1, lambda 1, V = 0: returns = rewards to go = [[1.2928932, 1], [2.7071068, 2.4142136]]
    rewards = torch.tensor([1.0, 3.0])
    mask = torch.ones(2, 2)
    _, returns, _ = ppo_advantages(rewards, torch.zeros(2, 2), mask, 1.0, 1.0, whiten_rewards=True)
    torch.testing.assert_close(returns, torch.tensor([[1.2928932, 1.0], [2.7071068, 2.4142136]]))
    with pytest.raises(ValueError, match="old_logprobs"):
        ppo_advantages(rewards, torch.zeros(2, 2), mask, ref_logprobs=torch.zeros(2, 2), beta=0.1)
