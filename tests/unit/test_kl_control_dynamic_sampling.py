"""The KL controllers (algos/kl_control.py) and DAPO's dynamic sampling (algos/dynamic_sampling.py)."""

from __future__ import annotations

import pytest
import torch

from grpokit.algos.advantages import zero_variance_groups
from grpokit.algos.dynamic_sampling import SamplingRounds, add_round, informative_groups
from grpokit.algos.kl_control import KLController, adaptive_kl_coef


def test_adaptive_controller_three_updates_by_hand():
    # beta 0.1, target 6, horizon 10000, 256 samples per step: K_beta = 256 / 10000 = 0.0256
    # 1) KL 9:   e = 9/6 - 1 = 0.5, clipped to 0.2:  beta = 0.1 * (1 + 0.2 * 0.0256) = 0.100512
    # 2) KL 3:   e = -0.5, clipped to -0.2:          beta = 0.100512 * (1 - 0.00512) = 0.0999973786
    # 3) KL 6.6: e = 0.1 (inside the clip):          beta = 0.0999973786 * (1 + 0.00256) = 0.1002533718
    controller = KLController(beta=0.1, target_kl=6.0, horizon=10000)
    assert controller.update(9.0, n_steps=256) == pytest.approx(0.100512, rel=1e-9)
    assert controller.update(3.0, n_steps=256) == pytest.approx(0.09999737856, rel=1e-9)
    assert controller.update(6.6, n_steps=256) == pytest.approx(0.10025337184, rel=1e-9)
    assert controller.beta == pytest.approx(0.10025337184, rel=1e-9)


def test_adaptive_kl_coef_on_target_keeps_beta():
    assert adaptive_kl_coef(0.3, current_kl=0.05, target_kl=0.05, horizon=100, n_steps=64) == 0.3


def test_fixed_controller_never_moves():
    controller = KLController(beta=0.04)
    assert not controller.adaptive
    for kl in (0.0, 10.0, 1e6):
        assert controller.update(kl, n_steps=128) == 0.04


def test_controller_state_round_trip():
    controller = KLController(beta=0.1, target_kl=6.0, horizon=10000)
    controller.update(9.0, n_steps=256)
    state = controller.state_dict()
    restored = KLController(beta=0.1, target_kl=6.0, horizon=10000)
    restored.load_state_dict(state)
    assert restored == controller
    assert restored.update(3.0, 256) == controller.update(3.0, 256)
    with pytest.raises(ValueError, match="not a KL controller state"):
        restored.load_state_dict({"beta": 1.0})


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"beta": -1.0}, "beta must be >= 0"),
        ({"beta": 0.1, "target_kl": 0.0}, "target_kl"),
        ({"beta": 0.1, "target_kl": 1.0, "horizon": 0}, "horizon"),
    ],
)
def test_controller_refuses_bad_settings(kwargs, message):
    with pytest.raises(ValueError, match=message):
        KLController(**kwargs)


def test_informative_groups_reuses_zero_variance():
    rewards = torch.tensor([1.0, 1.0, 0.0, 1.0, float("nan"), 2.0, float("nan"), float("nan")])
    # groups of 2: constant, varied, one reward only (constant), none (constant)
    assert informative_groups(rewards, 2).tolist() == [False, True, False, False]


def test_rounds_fill_the_target_by_hand():
    state = SamplingRounds(target_groups=3, max_rounds=3)
    # round 0, G = 2: groups 1 and 3 differ -> kept (0, 1), (0, 3)
    state = add_round(state, torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 1.0, 0.0]), 2)
    assert state.kept == ((0, 1), (0, 3)) and not state.done
    # round 1: groups 0 and 1 differ, room for one -> kept (1, 0); the target is reached
    state = add_round(state, torch.tensor([0.0, 1.0, 1.0, 0.0, 1.0, 1.0, 0.0, 0.0]), 2)
    assert state.kept == ((0, 1), (0, 3), (1, 0))
    assert state.done and not state.short
    assert (state.rounds, state.groups_seen) == (2, 8)
    assert state.rows(0, 2).tolist() == [2, 3, 6, 7]
    assert state.rows(1, 2).tolist() == [0, 1]
    with pytest.raises(ValueError, match="done after 2 rounds"):
        add_round(state, torch.tensor([0.0, 1.0]), 2)


def test_rounds_stop_at_the_cap():
    state = SamplingRounds(target_groups=2, max_rounds=3)
    for _ in range(3):
        assert not state.done
        state = add_round(state, torch.tensor([1.0, 1.0, 0.0, 0.0]), 2)  # every group ties
    assert state.done and state.short
    assert state.kept == () and state.rounds == 3 and state.groups_seen == 6
    assert state.rows(0, 2).tolist() == []
    with pytest.raises(ValueError, match="done after 3 rounds"):
        add_round(state, torch.tensor([0.0, 1.0]), 2)


def test_dynamic_sampling_never_keeps_a_zero_variance_group():
    generator = torch.Generator().manual_seed(0)
    G = 4
    for _ in range(20):
        state, rounds = SamplingRounds(target_groups=5, max_rounds=4), []
        while not state.done:
            rewards = torch.randint(0, 2, (6 * G,), generator=generator).float()  # binary: ties are common
            rewards[torch.rand(6 * G, generator=generator) < 0.1] = float("nan")
            rounds.append(rewards)
            state = add_round(state, rewards, G)
        assert len(state.kept) <= 5 and state.short == (len(state.kept) < 5)
        for r, rewards in enumerate(rounds):
            picked = rewards[state.rows(r, G)]
            assert not zero_variance_groups(picked, G).any()


def test_sampling_rounds_refuse_bad_settings():
    with pytest.raises(ValueError, match="target_groups"):
        SamplingRounds(target_groups=0, max_rounds=2)
    with pytest.raises(ValueError, match="max_rounds"):
        SamplingRounds(target_groups=2, max_rounds=0)
