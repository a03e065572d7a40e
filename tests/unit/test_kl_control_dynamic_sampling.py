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
    controller = KLController(beta=0.04, target_kl=None, horizon=10000.0)
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
        ({"beta": -1.0, "target_kl": None, "horizon": 10000.0}, "beta must be >= 0"),
        ({"beta": 0.1, "target_kl": 0.0, "horizon": 10000.0}, "target_kl"),
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


# ---- config: the options and their errors ------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"kl_controller": "adaptive"}, "kl_controller: adaptive needs target_kl > 0"),
        (
            {"kl_controller": "adaptive", "target_kl": 0.0},
            "needs target_kl > 0 (the KL to steer towards, e.g. 0.1), got 0",
        ),
        ({"kl_controller": "adaptive", "target_kl": 0.1, "beta": 0.0}, "beta=0 would stay 0"),
        ({"target_kl": 0.1}, "set kl_controller: adaptive, or remove target_kl"),
        ({"kl_controller": "adaptve"}, "Did you mean 'adaptive'?"),
        # 16 completions per step: a horizon of 3.2 or less could make 1 + 0.2 * 16 / horizon * (-1) <= 0
        ({"kl_controller": "adaptive", "target_kl": 0.1, "kl_horizon": 3.2}, "above 0.2 x completions per step (16)"),
        ({"max_sampling_rounds": 0}, "max_sampling_rounds=0 must be >= 1"),
        (
            {"dynamic_sampling": True, "backend": "ray", "async_rollouts": True},
            "set async_rollouts: false and max_staleness: 0 (Ray rollout workers still sample each round)",
        ),
        (
            {"dynamic_sampling": True, "algorithm": "ppo", "num_generations": 1},
            "a group of num_generations=1 never differs",
        ),
    ],
)
def test_config_refuses_bad_kl_control_and_dynamic_sampling(kwargs, message):
    from grpokit.config import ConfigError, GRPOConfig

    with pytest.raises(ConfigError) as err:
        GRPOConfig(**({"num_generations": 4, "per_device_train_batch_size": 16} | kwargs))
    assert message in str(err.value)


def test_config_refuses_dynamic_sampling_under_torchrun():
    from grpokit.config import ConfigError, GRPOConfig

    cfg = GRPOConfig(num_generations=4, per_device_train_batch_size=16, dynamic_sampling=True)
    cfg.validate(world_size=1)
    with pytest.raises(ConfigError, match=r"dynamic_sampling runs in one process; under torchrun \(2 processes\)"):
        cfg.validate(world_size=2)


# ---- train/experience/rounds.py: the rounds of one step, joined ---------------------------------------------------
def _round(indices, rewards, G=2, width=3, extra=None):
    """Sampled groups with token ids that name their row (row n of this round: ids 100*first_index + n)."""
    from grpokit.rewards.runner import RewardResult
    from grpokit.rollout.types import Rollouts
    from grpokit.train.experience.trajectory import Trajectory

    N = len(indices) * G
    ids = torch.arange(N)[:, None].repeat(1, width) + 100 * indices[0]  # [N, width]
    rollouts = Rollouts(
        prompt_ids=[[i] for i in indices],
        completion_ids=ids,
        completion_mask=torch.ones(N, width),
        logprobs=torch.zeros(N, width),
        finish_reasons=["stop"] * N,
        num_generations=G,
    )
    combined = torch.tensor(rewards, dtype=torch.float64)
    reward = RewardResult(
        names=["r"],
        per_func=combined[:, None],
        combined=combined,
        errors=[None] * N,
        error_counts={"r": 1},
        logged={"m": [float(indices[0])]},
        extra=extra or {},
    )
    return Trajectory(list(indices), rollouts, [f"c{indices[0]}-{n}" for n in range(N)], reward)


def rounds(target_groups, max_rounds, num_generations, num_mini_batches):
    """sample_rounds' settings (pad token 0)."""
    return dict(
        target_groups=target_groups,
        max_rounds=max_rounds,
        num_generations=num_generations,
        num_mini_batches=num_mini_batches,
        pad_token_id=0,
    )


def test_sample_rounds_fill_the_batch_and_join_every_round():
    from grpokit.algos.names import SAMPLING_GROUPS_TRAINED, SAMPLING_PROMPTS, SAMPLING_ROUNDS, SAMPLING_SHORT
    from grpokit.train.experience.rounds import sample_rounds

    # 3 prompts per round, G = 2, a batch of 3 groups. Round 0: only group 1 differs; round 1: groups 0 and 2
    # differ -> 3 groups after 2 rounds: rows 2,3 of round 0 and rows 0,1 and 4,5 of round 1 (= 6 + those)
    first = _round([10, 11, 12], [1, 1, 0, 1, 0, 0], extra={"note": ["a"] * 6})
    later = {1: _round([20, 21, 22], [0, 1, 1, 1, 1, 0])}
    asked = []

    def next_round(r):
        asked.append(r)
        return later[r]

    out = sample_rounds(first, next_round, **rounds(3, 5, 2, 1))
    assert asked == [1]
    assert out.train_rows.tolist() == [2, 3, 6, 7, 10, 11]
    assert out.metrics == {
        SAMPLING_ROUNDS: 2.0,
        SAMPLING_PROMPTS: 6.0,
        SAMPLING_GROUPS_TRAINED: 3.0,
        SAMPLING_SHORT: 0.0,
    }
    joined = out
    assert joined.indices == [10, 11, 12, 20, 21, 22]
    assert joined.completions[6] == "c20-0" and len(joined.completions) == 12
    assert joined.rollouts.completion_ids[:, 0].tolist() == [*range(1000, 1006), *range(2000, 2006)]
    assert joined.reward.combined.tolist() == [1, 1, 0, 1, 0, 0, 0, 1, 1, 1, 1, 0]
    assert joined.reward.error_counts == {"r": 2} and joined.reward.logged == {"m": [10.0, 20.0]}
    assert joined.reward.extra == {"note": ["a"] * 6 + [None] * 6}  # round 1 logged no "note"


def test_sample_rounds_at_the_cap_train_whole_mini_batches_or_nothing():
    from grpokit.algos.names import SAMPLING_GROUPS_TRAINED, SAMPLING_SHORT
    from grpokit.train.experience.rounds import sample_rounds

    # every round has exactly one informative group (group 0); cap 3 rounds -> 3 of 4 groups found, short
    def one_varied(r):
        return _round([10 * r + 1, 10 * r + 2], [0, 1, 1, 1])

    out = sample_rounds(one_varied(0), one_varied, **rounds(4, 3, 2, 1))
    assert out.metrics[SAMPLING_SHORT] == 1.0 and out.train_rows.tolist() == [0, 1, 4, 5, 8, 9]
    # with 2 mini-batches only 2 of the 3 groups are trained: whole groups in each mini-batch
    out = sample_rounds(one_varied(0), one_varied, **rounds(4, 3, 2, 2))
    assert out.metrics[SAMPLING_GROUPS_TRAINED] == 2.0 and out.train_rows.tolist() == [0, 1, 4, 5]
    # nothing informative within the cap: no row to train on
    out = sample_rounds(_round([1, 2], [1, 1, 0, 0]), lambda r: _round([3, 4], [1, 1, 0, 0]), **rounds(2, 2, 2, 1))
    assert out.train_rows.tolist() == [] and out.metrics[SAMPLING_GROUPS_TRAINED] == 0.0


def test_take_rows_keeps_whole_groups_and_their_prompts():
    from grpokit.train.experience.trajectory import take_rows

    rollouts = _round([5, 6, 7], [0, 1, 0, 1, 0, 1]).rollouts
    picked = take_rows(rollouts, torch.tensor([2, 3, 4, 5]))
    assert picked.prompt_ids == [[6], [7]]
    assert picked.completion_ids[:, 0].tolist() == [502, 503, 504, 505]
    assert picked.group_index.tolist() == [0, 0, 1, 1]
    assert picked.loss_mask is None and picked.conversations is None


def test_stored_advantages_and_repeated_prompts():
    from grpokit.train.experience.rounds import renumber_repeats
    from grpokit.train.experience.trajectory import stored_advantages

    stored = stored_advantages(torch.tensor([0.5, -0.5]), torch.tensor([2, 3]), 6)
    assert stored[2:4].tolist() == [0.5, -0.5] and stored[[0, 1, 4, 5]].isnan().all()

    from grpokit.store.record import RolloutRecord

    def record(prompt, completion):
        return RolloutRecord(prompt, completion, "p", "c", 1, 1, "stop", {}, 0.0, None, 0)

    # prompt 3 drawn in round 0 and again in round 1 (the data wrapped into a new epoch), G = 2
    records = [record(3, 0), record(3, 1), record(4, 0), record(4, 1), record(3, 0), record(3, 1)]
    out = renumber_repeats(records, 2)
    assert [(r.prompt_index, r.completion_index) for r in out] == [(3, 0), (3, 1), (4, 0), (4, 1), (3, 2), (3, 3)]
