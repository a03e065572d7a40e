"""The store's per-prompt history (grpokit/store/prompt_history.py): numbers worked by hand, written with the step's
rollouts, rebuilt exactly after a rollback, reconfigured, and read from a store that predates it."""

from __future__ import annotations

import json
import sqlite3

import pytest
from test_store import rollout

from grpokit.store import RolloutStore
from grpokit.store.prompt_history import prompt_hash, window_stats


def group(prompt_index: int, rewards: list) -> list:
    return [rollout(prompt_index, g, reward=r) for g, r in enumerate(rewards)]


def test_window_stats_by_hand():
    # [1, 0, 1, None], threshold 1: 2 of 4 pass; mean of 1, 0, 1 = 2/3; variance ((1/3)^2 + (2/3)^2 + (1/3)^2)/3 = 2/9
    assert window_stats([1.0, 0.0, 1.0, None], 1.0) == pytest.approx((0.5, 2 / 3, 2 / 9))
    # continuous rewards, threshold 0.5: 0.2 fails, 0.6 and 0.7 pass; mean 0.5; variance (0.09 + 0.01 + 0.04)/3
    assert window_stats([0.2, 0.6, 0.7], 0.5) == pytest.approx((2 / 3, 0.5, 0.14 / 3))
    assert window_stats([None, None], 1.0) == (0.0, None, None)


def test_history_is_written_with_each_step_over_the_last_window(tmp_path):
    with RolloutStore(tmp_path / "run") as store:
        store.configure_prompt_history(window=4, threshold=1.0)
        store.write_step(1, group(0, [1.0, 0.0, 0.0]) + group(3, [1.0, 1.0, 1.0]), {})
        store.write_step(2, group(0, [1.0, 1.0, 1.0]), {})
        rows = {row["prompt_index"]: row for row in store.prompt_history()}
    # prompt 0: six rewards 1 0 0 | 1 1 1; the last 4 are 0 1 1 1: pass 3/4, mean 0.75, var 0.75 * 0.25 = 0.1875
    p0 = rows[0]
    assert (p0["steps_sampled"], p0["samples"], p0["first_step"], p0["last_step"]) == (2, 6, 1, 2)
    assert p0["recent"] == [0.0, 1.0, 1.0, 1.0] and p0["recent_samples"] == 4
    assert (p0["pass_rate"], p0["mean_reward"], p0["reward_var"]) == pytest.approx((0.75, 0.75, 0.1875))
    assert p0["prompt_hash"] == prompt_hash("prompt 0") != rows[3]["prompt_hash"]
    assert (rows[3]["pass_rate"], rows[3]["reward_var"], rows[3]["last_step"]) == (1.0, 0.0, 1)


def test_rollback_rebuilds_the_history_of_the_steps_left(tmp_path):
    with RolloutStore(tmp_path / "a") as straight, RolloutStore(tmp_path / "b") as resumed:
        steps = [group(0, [1.0, 0.0]), group(0, [0.0, 0.0]) + group(1, [1.0, 1.0]), group(1, [0.0, 1.0])]
        for step, rows in enumerate(steps, 1):
            straight.write_step(step, rows, {})
            resumed.write_step(step, rows, {})
        resumed.write_step(4, group(0, [1.0, 1.0]), {})  # a step after the checkpoint, redone after the resume
        resumed.rollback_after(3)
        assert resumed.prompt_history() == straight.prompt_history()
        # prompt 0 after steps 1-2: rewards 1 0 0 0, pass rate 1/4, last step 2
        p0 = straight.prompt_history()[0]
        assert (p0["pass_rate"], p0["last_step"], p0["samples"]) == (0.25, 2, 4)


def test_a_failed_step_write_leaves_the_history_as_it_was(tmp_path):
    with RolloutStore(tmp_path / "run") as store:
        store.write_step(1, group(0, [1.0, 0.0]), {})
        before = store.prompt_history()
        with pytest.raises(Exception, match="already"):
            store.write_step(1, group(0, [1.0, 1.0]), {})
        assert store.prompt_history() == before


def test_a_new_threshold_rebuilds_and_an_older_store_gets_its_rows(tmp_path):
    with RolloutStore(tmp_path / "run") as store:
        store.write_step(1, group(0, [0.5, 1.0]), {})
        assert store.prompt_history()[0]["pass_rate"] == 0.5
        store.configure_prompt_history(window=16, threshold=0.5)
        assert store.prompt_history()[0]["pass_rate"] == 1.0
    with sqlite3.connect(tmp_path / "run" / "rollouts.sqlite") as db:  # as a store written before the table existed
        db.execute("DROP TABLE prompt_history")
    with RolloutStore(tmp_path / "run") as store:
        assert store.prompt_history()[0]["samples"] == 2


def test_inspect_prompts_prints_each_prompts_history(tmp_path):
    from grpokit.store.inspect import inspect_run
    from grpokit.store.store import StoreError

    with RolloutStore(tmp_path / "run") as store:
        store.write_step(1, group(0, [1.0, 0.0]) + group(2, [1.0, 1.0]), {})
        store.write_step(3, group(0, [1.0, 1.0]), {})
    rows = json.loads(inspect_run(tmp_path / "run", prompts=True, as_json=True, sort="pass_rate"))
    # prompt 0: 1 0 1 1 -> 0.75 over 4 samples in 2 steps, last step 3; prompt 2: 1 1 -> 1.0, last step 1
    assert [(r["prompt_index"], r["pass_rate"], r["samples"], r["steps_sampled"], r["last_step"]) for r in rows] == [
        (0, 0.75, 4, 2, 3),
        (2, 1.0, 2, 1, 1),
    ]
    table = inspect_run(tmp_path / "run", prompts=True)
    assert "pass rate" in table and "0.1875" in table and "streak" in table
    with pytest.raises(StoreError, match="--prompts lists every prompt"):
        inspect_run(tmp_path / "run", prompts=True, step=1)
    with RolloutStore(tmp_path / "empty"):
        pass
    assert inspect_run(tmp_path / "empty", prompts=True).startswith("no prompt history in this store")


def test_the_solved_streak_counts_visits_in_a_row_every_completion_passed(tmp_path):
    with RolloutStore(tmp_path / "run") as store:
        streaks = []
        for step, rewards in enumerate([[1.0, 1.0], [1.0, 1.0], [1.0, 0.0], [1.0, 1.0]], 1):
            store.write_step(step, group(0, rewards), {})
            streaks.append(store.prompt_history()[0]["solved_streak"])
    assert streaks == [1, 2, 0, 1]  # the failed completion of step 3 (forgetting) resets it
