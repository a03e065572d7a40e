import math

import pytest
import torch

from grpokit.algos import (
    compute_advantages,
    group_advantages,
    reinforce_pp_advantages,
    rloo_advantages,
    zero_variance_groups,
)

NAN = float("nan")


def test_group_scale_by_hand():
    # mean 2.5, deviations [-1.5, -0.5, 0.5, 1.5], sum of squares 5, unbiased var 5/3,
    # std 1.290994; A = deviation / 1.291094 -> [-1.161806, -0.387269, 0.387269, 1.161806]
    adv = group_advantages(torch.tensor([1.0, 2.0, 3.0, 4.0]), 4, "group")
    expected = torch.tensor([-1.161806, -0.387269, 0.387269, 1.161806])
    torch.testing.assert_close(adv, expected, atol=1e-5, rtol=0)
    assert abs(adv.sum().item()) < 1e-6
    torch.testing.assert_close(adv, -adv.flip(0))


def test_none_scale_is_plain_centering():
    # Dr. GRPO: r - group mean; group 2 has mean 6 -> [4, -4]
    adv = group_advantages(torch.tensor([1.0, 2.0, 3.0, 4.0, 10.0, 2.0]), 2, "none")
    torch.testing.assert_close(adv, torch.tensor([-0.5, 0.5, -0.5, 0.5, 4.0, -4.0]))


def test_batch_scale_uses_std_of_all_rewards():
    # all 8 rewards: mean 3.75, squared deviations 7.5625 3.0625 0.5625 0.0625 + 4 * 1.5625 = 17.5,
    # unbiased var 17.5 / 7 = 2.5, std 1.581139; group 1 deviations / 1.581239, group 2 constant -> 0
    rewards = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0, 5.0, 5.0, 5.0])
    adv = group_advantages(rewards, 4, "batch")
    expected = torch.tensor([-0.948623, -0.316208, 0.316208, 0.948623, 0.0, 0.0, 0.0, 0.0])
    torch.testing.assert_close(adv, expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_zero_std_group_gives_exact_zero(scale):
    # 0.1 * 3 / 3 is not exactly 0.1 in floating point; the advantages must still be exactly 0
    rewards = torch.tensor([0.1, 0.1, 0.1, 0.0, 1.0, 0.5])
    adv = group_advantages(rewards, 3, scale)
    assert torch.equal(adv[:3], torch.zeros(3))
    # group 2 has mean 0.5 exactly: [-, +, 0]
    assert adv[3] < 0 < adv[4] and adv[5] == 0


def test_nan_rewards_are_ignored():
    # group [1, nan, 3, nan]: mean 2, unbiased std sqrt((1 + 1) / 1) = 1.414214 -> +-1 / 1.414314
    adv = group_advantages(torch.tensor([1.0, NAN, 3.0, NAN]), 4, "group")
    torch.testing.assert_close(adv, torch.tensor([-0.707057, 0.0, 0.707057, 0.0]), atol=1e-5, rtol=0)
    assert not adv.isnan().any()


def test_all_nan_or_single_reward_group_is_zero():
    rewards = torch.tensor([NAN, NAN, 2.0, NAN, 1.0, 3.0])
    for scale in ("group", "batch", "none"):
        adv = group_advantages(rewards, 2, scale)
        assert torch.equal(adv[:4], torch.zeros(4))
        assert adv[4] < 0 < adv[5]


def test_rloo_by_hand():
    # [1,2,3,4]: 1 - mean(2,3,4) = -2, 2 - 8/3 = -2/3, 3 - 7/3 = 2/3, 4 - 2 = 2
    # [1,nan,3,nan]: baseline is the other non-NaN reward: 1 - 3 = -2, 3 - 1 = 2
    rewards = torch.tensor([1.0, 2.0, 3.0, 4.0, 1.0, NAN, 3.0, NAN])
    adv = rloo_advantages(rewards, 4)
    expected = torch.tensor([-2.0, -2 / 3, 2 / 3, 2.0, -2.0, 0.0, 2.0, 0.0])
    torch.testing.assert_close(adv, expected)


def test_rloo_is_scaled_centering():
    # r_i - mean(others) = G / (G - 1) * (r_i - mean(group))
    rewards = torch.randn(12, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(rloo_advantages(rewards, 3), 1.5 * group_advantages(rewards, 3, "none"))


def test_reinforce_pp_by_hand():
    # x = [-1.5, -0.5, 0.5, 1.5, 0, 0, 0, 0], mean 0, unbiased var 5 / 7, std 0.845154;
    # A = x / 0.845254 -> 1.5 / 0.845254 = 1.774611, 0.5 / 0.845254 = 0.591537
    rewards = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0, 5.0, 5.0, 5.0])
    adv = reinforce_pp_advantages(rewards, 4)
    expected = torch.tensor([-1.774611, -0.591537, 0.591537, 1.774611, 0.0, 0.0, 0.0, 0.0])
    torch.testing.assert_close(adv, expected, atol=1e-5, rtol=0)


def test_reinforce_pp_ignores_nan():
    # x over non-NaN: [-1, 1, -0.5, 0.5], mean 0, unbiased var (1 + 1 + 0.25 + 0.25) / 3 = 5/6,
    # std 0.912871; 1 / 0.912971 = 1.095325, 0.5 / 0.912971 = 0.547662
    rewards = torch.tensor([0.0, 2.0, NAN, 1.0, 2.0, NAN])
    adv = reinforce_pp_advantages(rewards, 3)
    expected = torch.tensor([-1.095325, 1.095325, 0.0, -0.547662, 0.547662, 0.0])
    torch.testing.assert_close(adv, expected, atol=1e-5, rtol=0)


def test_zero_variance_groups():
    # groups of 3: equal | different | equal ignoring NaN | all NaN | one reward | different
    rewards = torch.tensor([1.0, 1.0, 1.0, 0.0, 1.0, 1.0, NAN, 2.0, 2.0, NAN, NAN, NAN, NAN, 3.0, NAN, 1.0, NAN, 2.0])
    mask = zero_variance_groups(rewards, 3)
    assert mask.tolist() == [True] * 3 + [False] * 3 + [True] * 9 + [False] * 3
    assert mask.dtype == torch.bool


def test_compute_advantages_dispatch():
    rewards = torch.tensor([0.0, 1.0, 1.0, 3.0])
    torch.testing.assert_close(compute_advantages(rewards, 2), group_advantages(rewards, 2))
    torch.testing.assert_close(compute_advantages(rewards, 2, "grpo", "none"), group_advantages(rewards, 2, "none"))
    torch.testing.assert_close(compute_advantages(rewards, 2, "rloo"), rloo_advantages(rewards, 2))
    torch.testing.assert_close(compute_advantages(rewards, 2, "reinforce_pp"), reinforce_pp_advantages(rewards, 2))
    with pytest.raises(ValueError, match="grpo, rloo, reinforce_pp"):
        compute_advantages(rewards, 2, "ppo")
    with pytest.raises(ValueError, match="group, batch, none"):
        group_advantages(rewards, 2, "token")


def test_bad_shapes():
    with pytest.raises(ValueError, match="groups"):
        group_advantages(torch.zeros(5), 2)
    with pytest.raises(ValueError, match="1-D"):
        rloo_advantages(torch.zeros(2, 2), 2)


def test_integer_rewards_accepted():
    adv = group_advantages(torch.tensor([0, 1]), 2, "none")
    torch.testing.assert_close(adv, torch.tensor([-0.5, 0.5]))


def test_group_matches_reference_loop():
    gen = torch.Generator().manual_seed(1)
    rewards = torch.randn(24, generator=gen, dtype=torch.float64)
    rewards[[3, 10, 11]] = NAN
    g = 4
    for scale in ("group", "batch", "none"):
        adv = group_advantages(rewards, g, scale)
        values = rewards.tolist()
        present_all = [v for v in values if not math.isnan(v)]
        batch_mean = sum(present_all) / len(present_all)
        batch_std = math.sqrt(sum((v - batch_mean) ** 2 for v in present_all) / (len(present_all) - 1))
        for start in range(0, len(values), g):
            group = [v for v in values[start : start + g] if not math.isnan(v)]
            mean = sum(group) / len(group)
            std = math.sqrt(sum((v - mean) ** 2 for v in group) / (len(group) - 1))
            for i in range(start, start + g):
                if math.isnan(values[i]):
                    assert adv[i] == 0
                    continue
                scale_by = {"group": std + 1e-4, "batch": batch_std + 1e-4, "none": 1.0}[scale]
                assert adv[i].item() == pytest.approx((values[i] - mean) / scale_by, abs=1e-12)
