"""Curricula through the CLI on the tiny model: a `learnability` run killed with SIGKILL again and again, each process
resuming the last, draws the same prompts and ends with the same prompt_history table as an uninterrupted run; and a
data set every completion solves ends normally under dynamic sampling (with the `pools` curriculum retiring solved
prompts), its metrics saying why nothing was learned, and `grpokit inspect --prompts` shows each prompt's history."""

from __future__ import annotations

import json
import sqlite3
import sys
from pathlib import Path

import pytest
from shared_helpers import cli_env, kill_storm, logged_steps, stored, tiny_run_config
from shared_helpers import grpokit_cli as grpokit

G, PROMPTS_PER_STEP, STEPS, KILLS, SEED = 4, 2, 5, 2, 6161


def write_config(tmp_path: Path, model_dir: Path, name: str, **sections) -> Path:
    return tiny_run_config(
        tmp_path,
        model_dir,
        max_steps=STEPS,
        num_generations=G,
        prompts_per_step=PROMPTS_PER_STEP,
        name=name,
        data={"curriculum": "learnability", "history_window": 8},
        eval={"success_threshold": 0.25},  # a completion passes with one target word of four
        optim={"learning_rate": 5e-3, "lr_scheduler_type": "constant"},
        run={"save_steps": 1, "save_total_limit": 2},
        **sections,
    )


def history(run: Path) -> list[tuple]:
    with sqlite3.connect(run / "rollouts.sqlite") as db:
        return db.execute("SELECT * FROM prompt_history ORDER BY prompt_index").fetchall()


@pytest.mark.slow
def test_learnability_after_kill_storm_draws_what_the_uninterrupted_run_drew(tmp_path, tiny_model_dir):
    straight = write_config(tmp_path, tiny_model_dir, "straight")
    done = grpokit("train", straight)
    assert done.returncode == 0, done.stderr[-3000:]
    run = tmp_path / "run"
    config = write_config(tmp_path, tiny_model_dir, "run")
    first = grpokit("train", config, "max_steps=2")  # a checkpoint after two draws: the storm resumes past it
    assert first.returncode == 0, first.stderr[-3000:]
    command = [sys.executable, "-m", "grpokit.cli", "train", str(config), "resume_from=latest"]
    kills = kill_storm(command, run, cli_env(), tmp_path, KILLS, SEED, start_timeout=300)
    final = grpokit("train", config, "resume_from=latest")
    assert final.returncode == 0, "\n".join(kills) + "\n" + final.stderr[-3000:]

    assert stored(run) == stored(tmp_path / "straight"), "\n".join(kills)  # the same prompts, the same completions
    assert history(run) == history(tmp_path / "straight"), "\n".join(kills)
    with sqlite3.connect(run / "rollouts.sqlite") as db:  # the table is the rollouts' own summary
        counted = db.execute(
            "SELECT prompt_index, count(DISTINCT step), count(*), max(step) FROM rollouts GROUP BY prompt_index"
        ).fetchall()
        kept = db.execute("SELECT prompt_index, steps_sampled, samples, last_step FROM prompt_history").fetchall()
    assert sorted(kept) == sorted(counted)
    lines = logged_steps(run)
    assert [m["step"] for m in lines] == list(range(1, STEPS + 1))
    assert lines[0]["curriculum/unseen_prompts"] == 20  # step 1 draws before anything is known
    assert lines[-1]["curriculum/unseen_prompts"] < 20


@pytest.mark.slow
def test_an_all_solved_data_set_ends_normally_saying_why_it_learned_nothing(tmp_path, tiny_model_dir):
    rewards = tmp_path / "solved.py"
    rewards.write_text("def always_one(completions, **columns):\n    return [1.0] * len(completions)\n")
    config = tiny_run_config(
        tmp_path,
        tiny_model_dir,
        max_steps=2,
        num_generations=G,
        prompts_per_step=PROMPTS_PER_STEP,
        rewards=[f"{rewards}:always_one"],
        data={"curriculum": "pools", "retire_after": 1},
        algo={"dynamic_sampling": True, "max_sampling_rounds": 3},
    )
    done = grpokit("train", config)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in lines if "step" in m and "curriculum/learned_nothing" in m]
    assert [m["step"] for m in steps] == [1, 2]
    for m in steps:
        assert m["curriculum/learned_nothing"] == 1.0 and "loss" not in m  # no update, and the metric says so
        # three rounds of 2 prompts, each group all 1.0: 6 zero-variance groups, none of them trained on
        assert (m["curriculum/zero_variance_groups"], m["curriculum/zero_variance_fraction"]) == (6.0, 1.0)
        assert m["curriculum/zero_variance_trained"] == 0.0
        assert m["dynamic_sampling/short"] == 1.0  # the budget of rounds was spent
    # step 2 draws after step 1 stored its 6 prompts, each solved by every completion: 6 easy (pass rate 1 >= 0.8),
    # 6 retired (solved 1 visit in a row), 14 never sampled (normal)
    assert (steps[1]["curriculum/pool_easy"], steps[1]["curriculum/pool_normal"]) == (6.0, 14.0)
    assert steps[1]["curriculum/retired_prompts"] == 6.0 and steps[0]["curriculum/unseen_prompts"] == 20.0
    shown = grpokit("inspect", tmp_path / "run", "--prompts", "--json")
    assert shown.returncode == 0, shown.stderr[-3000:]
    rows = json.loads(shown.stdout)
    assert 6 < len(rows) <= 12 and {r["pass_rate"] for r in rows} == {1.0}  # 2 steps x 3 rounds x 2 prompts
    assert sum(r["samples"] for r in rows) == 2 * 3 * PROMPTS_PER_STEP * G


@pytest.mark.slow
def test_learnability_with_batches_sampled_ahead(tmp_path, tiny_model_dir):
    """max_staleness 1: step s + 1's batch is drawn (on the main thread) before step s trains, from the history
    stored so far; the run ends with a history that sums the stored rollouts."""
    config = write_config(tmp_path, tiny_model_dir, "run", distributed={"max_staleness": 1})
    done = grpokit("train", config, "max_steps=3")
    assert done.returncode == 0, done.stderr[-3000:]
    with sqlite3.connect(tmp_path / "run" / "rollouts.sqlite") as db:
        kept = db.execute("SELECT sum(samples), count(*) FROM prompt_history").fetchone()
        stored_rows = db.execute("SELECT count(*), count(DISTINCT prompt_index) FROM rollouts").fetchone()
    assert kept == stored_rows and kept[0] == 3 * PROMPTS_PER_STEP * G
    lines = logged_steps(tmp_path / "run")
    # a step logs the latest draw: step 1 that of step 2's batch (drawn with step 1's, nothing stored), step 2 that of
    # step 3's (drawn after step 1 stored its 2 prompts), step 3 draws nothing more (the last step)
    assert [m["curriculum/unseen_prompts"] for m in lines] == [20.0, 18.0, 18.0]
