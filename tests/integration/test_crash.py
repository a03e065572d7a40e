"""SIGKILL at random moments: ten training processes are killed one after another, each resuming the
previous one (``resume_from=latest``); after every kill the run folder is consistent, and the run
finally completes with every step exactly once in rollouts.sqlite and metrics.jsonl."""

from __future__ import annotations

import contextlib
import json
import random
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from shared_helpers import cli_env
from test_signals import assert_run_consistent, write_run_config

from grpokit.train.rundir.checkpoint import list_checkpoints

MAX_STEPS, KILLS, SEED = 8, 10, 1234


def metric_steps(run: Path) -> list[int]:
    """Steps in metrics.jsonl; a last line torn by the kill is not a step."""
    path = run / "metrics.jsonl"
    if not path.exists():
        return []
    steps = []
    for line in path.read_text().splitlines():
        with contextlib.suppress(json.JSONDecodeError):
            steps.append(json.loads(line)["step"])
    return steps


def assert_consistent_after_kill(run: Path, context: str) -> None:
    """What a kill may leave: steps past the last checkpoint (a resume redoes them), never a gap,
    a duplicate, a damaged database or a checkpoint folder that does not load."""
    if (run / "rollouts.sqlite").exists():
        with sqlite3.connect(run / "rollouts.sqlite") as db:
            assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok", context
            stored = [s for (s,) in db.execute("SELECT step FROM steps ORDER BY step")]
        assert stored == list(range(1, len(stored) + 1)), context
    logged = metric_steps(run)
    assert logged == list(range(1, len(logged) + 1)), context
    for folder in list_checkpoints(run):
        assert json.loads((folder / "trainer_state.json").read_text())["step"] == int(folder.name.split("-")[1]), (
            context
        )
        assert load_file(folder / "model.safetensors"), context
        torch.load(folder / "states.pt", weights_only=True)


def start(config: Path, log: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "grpokit.cli", "train", str(config), "resume_from=latest"],
        env=cli_env(),
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
    )


def wait_for_new_step(proc: subprocess.Popen, run: Path, seen: int, limit: float = 120.0) -> None:
    deadline = time.monotonic() + limit
    while proc.poll() is None and len(metric_steps(run)) <= seen and time.monotonic() < deadline:
        time.sleep(0.02)


@pytest.mark.slow
def test_sigkill_at_random_moments_then_resume(tmp_path, tiny_model_dir):
    rng = random.Random(SEED)
    config = write_run_config(tmp_path, tiny_model_dir, MAX_STEPS)
    run = tmp_path / "run"
    history = []
    for kill in range(KILLS):
        log = tmp_path / f"log-{kill}.txt"
        proc = start(config, log)
        if rng.random() < 0.2:
            moment = ("during start-up", rng.uniform(0.5, 4.0))  # model loading, resume, store opening
        else:
            wait_for_new_step(proc, run, len(metric_steps(run)))
            moment = ("after a step was logged", rng.uniform(0.0, 1.0))  # the next step, its checkpoint, the end
        time.sleep(moment[1])
        proc.kill()
        proc.wait(timeout=60)
        checkpoints = [p.name for p in list_checkpoints(run)]
        history.append(
            f"kill {kill}: {moment[0]} + {moment[1]:.2f}s, exit {proc.returncode}, checkpoints {checkpoints}"
        )
        assert_consistent_after_kill(run, "\n".join(history) + "\n" + log.read_text()[-2000:])

    print("\n".join(history))  # shown with -s, and by pytest when a later assertion fails
    log = tmp_path / "log-final.txt"
    final = start(config, log)
    assert final.wait(timeout=600) == 0, "\n".join(history) + "\n" + log.read_text()[-3000:]
    assert_run_consistent(run, MAX_STEPS)
    assert [p.name for p in list_checkpoints(run)] == [f"step-{MAX_STEPS - 1}", f"step-{MAX_STEPS}"]
    assert not [p for p in (run / "checkpoints").iterdir() if p.name.startswith(".")]  # no leftover temporary folders
