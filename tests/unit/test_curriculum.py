"""Curricula (grpokit/data/curriculum.py): the learnability weights by hand, draws fixed by (seed, draws, history),
a checkpoint's draw count resuming the same batches, the registry, and the settings' one-line errors."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from grpokit.config import ConfigError, GRPOConfig
from grpokit.data.curriculum import CURRICULA, Curriculum, learnability_weights, register_curriculum
from grpokit.store.prompt_history import prompt_hash

SETTINGS = SimpleNamespace(learnability_prior=0.5, learnability_floor=0.01)


def source(n: int = 6):
    """What a curriculum reads of a PromptSource: its usable rows and their texts."""
    return SimpleNamespace(usable=np.arange(n), texts=[f"prompt {i}" for i in range(n)])


def history(rates: dict[int, float]) -> list[dict]:
    return [
        {
            "prompt_index": i,
            "prompt_hash": prompt_hash(f"prompt {i}"),
            "pass_rate": p,
            "recent_samples": 8,
            "samples": 8,
        }
        for i, p in rates.items()
    ]


def test_learnability_weights_by_hand():
    # p = 0.5 -> 0.25; 0.9 -> 0.9 * 0.1 = 0.09; 1 and 0 -> the floor 0.01; unseen (NaN) -> the prior 0.2: 0.16
    weights = learnability_weights(np.array([0.5, 0.9, 1.0, 0.0, np.nan]), prior=0.2, floor=0.01)
    np.testing.assert_allclose(weights, [0.25, 0.09, 0.01, 0.01, 0.16])


def test_learnability_draws_follow_the_weights():
    # prompts 0-4 solved (floor 0.01 each), prompt 5 at p = 0.5 (0.25): prompt 5 has probability 0.25 / 0.30 of being
    # drawn first; over 3000 one-prompt draws its share is 0.833 +- 0.02 (4 sigma: sqrt(.833 * .167 / 3000) = 0.0068)
    curriculum = Curriculum("learnability", SETTINGS, seed=3)
    curriculum.history = lambda: history({0: 1.0, 1: 1.0, 2: 1.0, 3: 0.0, 4: 0.0, 5: 0.5})
    drawn = [curriculum.choose(source(), 1)[0] for _ in range(3000)]
    assert abs(drawn.count(5) / 3000 - 0.25 / 0.30) < 0.03
    metrics = curriculum.metrics()
    assert (metrics["curriculum/solved_prompts"], metrics["curriculum/unsolved_prompts"]) == (3.0, 2.0)
    assert metrics["curriculum/unseen_prompts"] == 0.0


def test_a_changed_prompt_text_counts_as_unseen():
    curriculum = Curriculum("learnability", SETTINGS, seed=0)
    curriculum.history = lambda: [
        {"prompt_index": 0, "prompt_hash": "edited", "pass_rate": 1.0, "recent_samples": 4, "samples": 4}
    ]
    stats = curriculum.stats(source(2))
    assert np.isnan(stats.pass_rate).all() and stats.samples.tolist() == [0, 0]


def test_same_seed_draws_and_history_give_the_same_batch_and_a_resume_continues():
    rates = {0: 0.5, 1: 0.25, 2: 1.0}
    straight = Curriculum("learnability", SETTINGS, seed=7)
    straight.history = lambda: history(rates)
    batches = [straight.choose(source(), 3) for _ in range(2)]
    state = straight.state_dict()  # a checkpoint after 2 draws
    batches += [straight.choose(source(), 3) for _ in range(2)]
    assert all(len(set(b)) == 3 for b in batches) and len({tuple(b) for b in batches}) > 1
    resumed = Curriculum("learnability", SETTINGS, seed=7)
    resumed.history = lambda: history(rates)
    resumed.load_state_dict({"epoch": 0, "position": 0, **state})
    assert [resumed.choose(source(), 3) for _ in range(2)] == batches[2:]
    other = Curriculum("learnability", SETTINGS, seed=8)
    other.history = lambda: history(rates)
    assert [other.choose(source(), 3) for _ in range(4)] != batches


def test_uniform_keeps_the_sources_order_and_reads_nothing():
    curriculum = Curriculum("uniform", SETTINGS, seed=0)
    curriculum.history = lambda: pytest.fail("uniform read the history")
    assert curriculum.choose(source(), 2) is None and curriculum.metrics() == {}


def test_a_registered_curriculum_is_drawn_and_bad_weights_are_one_clear_error():
    @register_curriculum("only_first_test")
    def only_first(stats, settings):
        return np.where(stats.indices == 0, 1.0, 1e-12)

    try:
        curriculum = Curriculum("only_first_test", SETTINGS, seed=0)
        assert curriculum.choose(source(), 1) == [0]
        assert GRPOConfig(output_dir="/tmp/unused", curriculum="only_first_test").curriculum == "only_first_test"

        @register_curriculum("zero_test")
        def zero(stats, settings):
            return np.zeros(len(stats.indices))

        with pytest.raises(ValueError, match="one finite weight > 0 per prompt"):
            Curriculum("zero_test", SETTINGS, seed=0).choose(source(), 1)
    finally:
        CURRICULA.pop("only_first_test", None)
        CURRICULA.pop("zero_test", None)


@pytest.mark.parametrize(
    "key, value, message",
    [
        ("curriculum", "learnabilty", "did you mean 'learnability'"),
        ("learnability_floor", 0.0, "would let a solved prompt starve"),
        ("learnability_prior", 1.5, "in \\[0, 1\\]"),
        ("history_window", 0, "history_window=0 must be >= 1"),
    ],
)
def test_bad_settings_are_one_line(key, value, message):
    with pytest.raises(ConfigError, match=message):
        GRPOConfig(output_dir="/tmp/unused", **{key: value})


def test_zero_variance_counts_by_hand():
    import torch

    from grpokit.algos.dynamic_sampling import zero_variance_counts

    rewards = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.5, 0.5])  # groups of 2: tie | spread | tie
    assert zero_variance_counts(rewards, 2) == (3, 2, 2)  # every row trained: both ties kept
    assert zero_variance_counts(rewards, 2, torch.tensor([2, 3])) == (3, 2, 0)  # the spread group only
    # continuous rewards with the same mean 0.5: (0.5, 0.5) ties, (0.2, 0.8) does not; the variance decides
    assert zero_variance_counts(torch.tensor([0.5, 0.5, 0.2, 0.8]), 2) == (2, 1, 1)


def test_a_further_round_before_the_history_grows_draws_other_prompts():
    rows = history({0: 0.5, 1: 0.5})
    curriculum = Curriculum("learnability", SETTINGS, seed=1)
    curriculum.history = lambda: rows
    first, second = curriculum.choose(source(), 3), curriculum.choose(source(), 3)
    assert sorted(first + second) == list(range(6))  # dynamic sampling's second round: the 3 prompts not drawn yet
    state = curriculum.state_dict()
    third = curriculum.choose(source(), 3)  # none left: all 6 may come again
    assert len(set(third)) == 3
    resumed = Curriculum("learnability", SETTINGS, seed=1)
    resumed.history = lambda: rows
    resumed.load_state_dict(state)
    assert resumed.choose(source(), 3) == third
    rows.append({"prompt_index": 5, "prompt_hash": prompt_hash("prompt 5"), "pass_rate": 0.0, "recent_samples": 8})
    rows[-1]["samples"] = 8  # a step was stored: the prompts of the last draws may come again
    assert len(curriculum.choose(source(), 6)) == 6


def test_pools_by_hand():
    from grpokit.data.curriculum import pool_of, pools

    settings = SimpleNamespace(pool_easy_above=0.8, pool_hard_below=0.2, pool_weights=[0.1, 0.8, 0.1])
    rates = np.array([1.0, 0.8, 0.5, np.nan, 0.2, 0.0])
    assert pool_of(rates, 0.8, 0.2).tolist() == [0, 0, 1, 1, 2, 2]  # easy easy normal normal(unseen) hard hard
    weights, metrics = pools(SimpleNamespace(pass_rate=rates), settings)
    # each pool has 2 prompts: easy 0.1 / 2, normal 0.8 / 2, hard 0.1 / 2
    np.testing.assert_allclose(weights, [0.05, 0.05, 0.4, 0.4, 0.05, 0.05])
    assert metrics == {"curriculum/pool_easy": 2.0, "curriculum/pool_normal": 2.0, "curriculum/pool_hard": 2.0}
    # no hard prompt: easy 0.1 over 1 prompt, normal 0.8 over 2; the shares stay 0.1 : 0.8 (normalized: 1/9, 8/9)
    weights, _ = pools(SimpleNamespace(pass_rate=np.array([0.9, 0.5, np.nan])), settings)
    np.testing.assert_allclose(weights, [0.1, 0.4, 0.4])


def test_a_retired_prompt_is_drawn_at_the_revisit_rate():
    # prompts 0-1 at p = 0.5 (weight 0.25); prompt 1 retired (streak 3 >= 3): 0.25 * 0.1 = 0.025. A one-prompt draw
    # picks prompt 1 with probability 0.025 / 0.275 = 0.0909; over 3000 draws 0.091 +- 0.021 (4 sigma: 0.0052 each)
    settings = SimpleNamespace(**vars(SETTINGS), retire_after=3, retire_revisit=0.1)
    rows = history({0: 0.5, 1: 0.5})
    rows[1]["solved_streak"] = 3
    curriculum = Curriculum("learnability", settings, seed=5)
    curriculum.history = lambda: rows
    drawn = [curriculum.choose(source(2), 1)[0] for _ in range(3000)]
    assert abs(drawn.count(1) / 3000 - 0.025 / 0.275) < 0.021
    assert curriculum.metrics()["curriculum/retired_prompts"] == 1.0


@pytest.mark.parametrize(
    "values, message",
    [
        ({"pool_weights": [0.1, 0.0, 0.1]}, "three weights > 0"),
        ({"pool_hard_below": 0.9}, "0 <= pool_hard_below < pool_easy_above"),
        ({"retire_after": 2}, "retire_after needs a curriculum that weighs prompts"),
        ({"curriculum": "pools", "retire_after": 0}, "retire_after=0 must be >= 1"),
    ],
)
def test_bad_pool_and_retire_settings_are_one_line(values, message):
    with pytest.raises(ConfigError, match=message):
        GRPOConfig(output_dir="/tmp/unused", **values)
