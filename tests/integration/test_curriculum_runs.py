"""Curricula through the CLI on the tiny model: a `learnability` run killed with SIGKILL again and again, each process
resuming the last, draws the same prompts and ends with the same prompt_history table as an uninterrupted run; and a
data set every completion solves ends normally under dynamic sampling (with the `pools` curriculum retiring solved
prompts), its metrics saying why nothing was learned, and `grpokit inspect --prompts` shows each prompt's history;
under torchrun (two gloo processes) rank 0 draws each step's batch by its history and every rank trains its share, as
one process would."""

from __future__ import annotations

import json
import sqlite3
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from shared_helpers import cli_env, kill_storm, logged_steps, stored, tiny_run_config
from shared_helpers import grpokit_cli as grpokit
from test_distributed import torchrun

G, PROMPTS_PER_STEP, STEPS, KILLS, SEED = 4, 2, 5, 2, 6161
PRIOR = 0.05  # the torchrun test's learnability_prior


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


def history_counts(run: Path) -> tuple[list, list]:
    """(what prompt_history says of each prompt, the same counted from the stored rollouts)."""
    with sqlite3.connect(run / "rollouts.sqlite") as db:
        counted = db.execute(
            "SELECT prompt_index, count(DISTINCT step), count(*), max(step) FROM rollouts GROUP BY prompt_index"
        ).fetchall()
        kept = db.execute("SELECT prompt_index, steps_sampled, samples, last_step FROM prompt_history").fetchall()
    return sorted(kept), sorted(counted)


def drawn_in_order(run: Path) -> list[list[int]]:
    """Each step's prompts in the order stored: under torchrun rank 0 gathers the records in rank order, so rank 0's
    share of the draw comes first, then rank 1's."""
    with sqlite3.connect(run / "rollouts.sqlite") as db:
        rows = db.execute("SELECT step, prompt_index FROM rollouts ORDER BY rowid").fetchall()
    steps: dict[int, list[int]] = {}
    for step, index in rows:
        if index not in steps.setdefault(step, []):
            steps[step].append(index)
    return [steps[s] for s in sorted(steps)]


def replayed_draws(run: Path, tmp_path: Path, steps: int, batch: int, ahead: int = 0) -> list[list[int]]:
    """What one process's `learnability` curriculum (the run's default seed and settings) draws for each step from
    the history of the steps before it (``ahead`` K: before step - K, as with ``max_staleness`` K), rebuilt from a
    copy of the store's rollouts of those steps."""
    import shutil

    from grpokit.config import GRPOConfig
    from grpokit.data.curriculum import Curriculum
    from grpokit.store import prompt_history

    settings = GRPOConfig(curriculum="learnability", learnability_prior=PRIOR)
    curriculum, draws = Curriculum("learnability", settings, settings.seed), []
    for step in range(1, steps + 1):
        copy = tmp_path / f"replay-{step}.sqlite"
        shutil.copy(run / "rollouts.sqlite", copy)
        with sqlite3.connect(copy, isolation_level=None) as db:
            db.execute("BEGIN")
            db.execute("DELETE FROM rollouts WHERE step >= ?", (step - ahead,))
            prompt_history.rebuild(db)  # with the store's window and success threshold
            db.execute("COMMIT")
            texts = dict(db.execute("SELECT prompt_index, prompt FROM rollouts").fetchall())
            known = prompt_history.read(db)
        curriculum.history = lambda known=known: known
        source = SimpleNamespace(usable=np.arange(20), texts=[texts.get(i, "") for i in range(20)])
        draws.append(curriculum.choose(source, batch))
    return draws


@pytest.mark.slow
def test_learnability_under_torchrun_draws_on_rank_0_for_every_rank(tmp_path, tiny_model_dir):
    # 2 processes x 8 completions = 4 prompts of G 4 a step, 2 a rank. Half of each group passes, so a prompt drawn
    # before weighs p (1 - p) = 0.25 and one never drawn 0.05 x 0.95 = 0.0475 (the prior 0.05): a rank drawing
    # without the history (all unseen, the drawn ones left out) would draw other prompts than rank 0
    rewards = tmp_path / "half.py"
    rewards.write_text(
        "def half(completions, **columns):\n    return [float(i % 2) for i in range(len(completions))]\n"
    )

    def config(name: str, steps: int, **run) -> Path:
        return tiny_run_config(
            tmp_path,
            tiny_model_dir,
            max_steps=steps,
            num_generations=G,
            prompts_per_step=2,
            name=name,
            rewards=[f"{rewards}:half"],
            data={"curriculum": "learnability", "history_window": 8, "learnability_prior": PRIOR},
            optim={"learning_rate": 5e-3, "lr_scheduler_type": "constant"},
            run=run,
        )

    torchrun(config("run", 3, save_steps=0))
    run = tmp_path / "run"

    drawn = drawn_in_order(run)
    assert [len(batch) for batch in drawn] == [4, 4, 4]
    # each step's batch is the one rank 0's curriculum draws from the history stored before it; rank 0 trained its
    # first half, rank 1 its second (stored in rank order)
    assert drawn == replayed_draws(run, tmp_path, 3, 4)
    kept, counted = history_counts(run)
    assert kept == counted and sum(row[2] for row in kept) == 3 * 4 * G  # the table sums every rank's rollouts
    lines = logged_steps(run)
    assert [m["step"] for m in lines] == [1, 2, 3]
    # rank 0 read the history: step 1 drew with nothing known, step 3 after steps 1 and 2 stored their prompts, and
    # drew some of them again (weight 0.25 against 0.0475)
    assert set(drawn[2]) & set(drawn[0] + drawn[1])
    assert lines[0]["curriculum/unseen_prompts"] == 20.0
    assert lines[2]["curriculum/unseen_prompts"] == 20.0 - len(set(drawn[0] + drawn[1]))

    # resumed after step 2 (rank 0's checkpoint holds its draw count): step 3 draws what the straight run drew
    torchrun(config("resumed", 2, save_steps=1))
    torchrun(config("resumed", 3, save_steps=1, resume_from="latest"))
    assert drawn_in_order(tmp_path / "resumed") == drawn
    assert history(tmp_path / "resumed") == history(run)
