"""SIGINT / SIGTERM during generation or during the update: the step finishes, a checkpoint is written,
the store and metrics are flushed, the exit code is 130 / 143, and ``resume_from=latest`` continues.

Also holds the helpers test_crash.py uses: a run config on the tiny model, and the check that a run
folder is consistent (integrity of the store, every step once, every checkpoint loadable)."""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from shared_helpers import cli_env, tiny_run_config

from grpokit.cli import main
from grpokit.train.rundir.checkpoint import list_checkpoints

G, PROMPTS_PER_STEP = 4, 2


def write_run_config(tmp_path: Path, model_dir: Path, max_steps: int) -> Path:
    """A config on the tiny model that checkpoints every step; the run folder is tmp_path / 'run'."""
    path = tiny_run_config(
        tmp_path,
        model_dir,
        max_steps=max_steps,
        num_generations=G,
        prompts_per_step=PROMPTS_PER_STEP,
        run={"save_steps": 1, "save_total_limit": 2},
    )
    return path.rename(tmp_path / "config.yaml")


def assert_run_consistent(run: Path, last_step: int) -> None:
    """The store passes SQLite's integrity check and holds steps 1..last_step exactly once with all
    their rollouts; metrics.jsonl has one line per step (besides eval lines); every checkpoint folder loads."""
    with sqlite3.connect(run / "rollouts.sqlite") as db:
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert [s for (s,) in db.execute("SELECT step FROM steps ORDER BY step")] == list(range(1, last_step + 1))
        per_step = dict(db.execute("SELECT step, count(*) FROM rollouts GROUP BY step"))
        assert per_step == {s: G * PROMPTS_PER_STEP for s in range(1, last_step + 1)}
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    trained = [r["step"] for r in records if any(not key.startswith("eval/") for key in r if key != "step")]
    assert trained == list(range(1, last_step + 1))
    for folder in list_checkpoints(run):
        state = json.loads((folder / "trainer_state.json").read_text())
        assert folder.name == f"step-{state['step']}"
        assert load_file(folder / "model.safetensors")
        assert set(torch.load(folder / "states.pt", weights_only=True)) == {"optimizer", "scheduler", "rng"}


# Runs `grpokit train` with a patch: when TARGET ("module:Class.method" or "module:function") is called
# for the CALL-th time it sends the process each of the comma-separated SIGNALS, then runs the real code.
DRIVER = """
import importlib, os, signal, sys

module, path = sys.argv[1].split(":")
owner = importlib.import_module(module)
*parents, method = path.split(".")
for name in parents:
    owner = getattr(owner, name)
call, signums = int(sys.argv[2]), [getattr(signal, name) for name in sys.argv[3].split(",")]
real, calls = getattr(owner, method), []

def patched(*args, **kwargs):
    calls.append(1)
    if len(calls) == call:
        for signum in signums:
            os.kill(os.getpid(), signum)
    return real(*args, **kwargs)

setattr(owner, method, patched)
from grpokit.cli import main
sys.exit(main(["train", *sys.argv[4:]]))
"""

PHASES = {  # phase -> (patched callable, which call: step 2's; evaluate's call 1 is the eval of step 0)
    "sampling": ("grpokit.rollout.engine:HFRolloutEngine.generate", 2),
    "reference": ("grpokit.train.learning.learner:Learner.reference_logprobs", 2),
    "update": ("grpokit.train.learning.learner:Learner.update", 2),
    "evaluation": ("grpokit.trl.trainer:GRPOTrainer.evaluate", 3),
    "checkpointing": ("grpokit.train.rundir.checkpoint:save_checkpoint", 2),
}
EVAL = ["eval_dataset={data}", "eval_steps=1", "max_eval_prompts=2", "num_generations_eval=2", "pass_at_k=[1]"]


def run_driver(tmp_path, config, target, call, signals, *overrides):
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    proc = subprocess.run(
        [sys.executable, str(driver), target, str(call), signals, str(config), *overrides],
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


def stop_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "SIGINT" in line or "SIGTERM" in line]


@pytest.mark.slow
@pytest.mark.parametrize(
    "phase, signame, code, resume",
    [
        ("sampling", "SIGINT", 130, True),
        ("update", "SIGTERM", 143, False),
        ("reference", "SIGINT", 130, False),
        ("evaluation", "SIGTERM", 143, False),
        ("checkpointing", "SIGINT", 130, False),
    ],
)
def test_signal_stops_after_the_step_with_a_checkpoint_that_resumes(
    tmp_path, tiny_model_dir, phase, signame, code, resume
):
    """A signal in any phase of step 2 finishes that step (and its evaluation), saves it once,
    prints one line and exits 128 + signum; nothing after the step is written, and a resume continues."""
    config = write_run_config(tmp_path, tiny_model_dir, max_steps=3)
    overrides = [x.format(data=tmp_path / "train.jsonl") for x in EVAL] if phase == "evaluation" else []
    target, call = PHASES[phase]
    proc = run_driver(tmp_path, config, target, call, signame, *overrides)
    assert proc.returncode == code, proc.stderr
    last = 2
    assert stop_lines(proc.stderr) == [
        f"stopped at step {last}: received {signame}; saved checkpoint step-{last}, resume with resume_from=latest"
    ]
    run = tmp_path / "run"
    assert list_checkpoints(run)[-1].name == f"step-{last}"
    assert not (run / "final").exists()  # an interrupted run has no final model
    assert_run_consistent(run, last_step=last)
    if not resume:
        return
    assert main(["train", str(config), "resume_from=latest"]) == 0
    assert_run_consistent(run, last_step=3)
    assert [p.name for p in list_checkpoints(run)] == ["step-2", "step-3"]
    assert (run / "final" / "model.safetensors").exists()


@pytest.mark.slow
def test_signal_while_a_slow_reward_runs(tmp_path, tiny_model_dir):
    """SIGTERM while step 2's reward function sleeps: the step finishes and is saved; exit 143."""
    config = write_run_config(tmp_path, tiny_model_dir, max_steps=3)
    reward = Path(__file__).with_name("rewards_signal.py")
    spec = json.dumps([{"name": f"{reward}:slow_target_fraction", "at": 2, "signal": "SIGTERM"}])
    env = dict(cli_env(), GRPOKIT_TEST_CALLS=str(tmp_path / "calls"))
    script = (
        "import os, sys; os.environ['GRPOKIT_TEST_TRAINER_PID'] = str(os.getpid()); "
        "from grpokit.cli import main; sys.exit(main(sys.argv[1:]))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script, "train", str(config), f"rewards={spec}"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 143, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    assert stop_lines(proc.stderr) == [
        "stopped at step 2: received SIGTERM; saved checkpoint step-2, resume with resume_from=latest"
    ]
    assert_run_consistent(tmp_path / "run", last_step=2)


@pytest.mark.slow
def test_signal_before_the_first_step_finished_saves_nothing(tmp_path, tiny_model_dir):
    """SIGINT during the step-0 evaluation: no finished step, so no checkpoint and no final model."""
    config = write_run_config(tmp_path, tiny_model_dir, max_steps=3)
    overrides = [x.format(data=tmp_path / "train.jsonl") for x in EVAL]
    proc = run_driver(tmp_path, config, "grpokit.trl.trainer:GRPOTrainer.evaluate", 1, "SIGINT", *overrides)
    assert proc.returncode == 130, proc.stderr
    assert stop_lines(proc.stderr) == [
        "stopped at step 0: received SIGINT before the first step finished; there was nothing to save"
    ]
    assert list_checkpoints(tmp_path / "run") == [] and not (tmp_path / "run" / "final").exists()


@pytest.mark.slow
def test_second_signal_stops_at_once_leaving_the_last_checkpoint(tmp_path, tiny_model_dir):
    """Two SIGINTs in step 2's update: the second stops at once (one line, exit 130); step 1 stays the
    last step in the store and on disk, both intact."""
    config = write_run_config(tmp_path, tiny_model_dir, max_steps=3)
    proc = run_driver(tmp_path, config, "grpokit.train.learning.learner:Learner.update", 2, "SIGINT,SIGINT")
    assert proc.returncode == 130, proc.stderr
    assert stop_lines(proc.stderr) == [
        "grpokit: stopped at once by a second SIGINT, during step 2; "
        "the last saved state is checkpoint step-1 (resume_from=latest)"
    ]
    run = tmp_path / "run"
    assert [p.name for p in list_checkpoints(run)] == ["step-1"]
    assert_run_consistent(run, last_step=1)
    assert main(["train", str(config), "resume_from=latest"]) == 0
    assert_run_consistent(run, last_step=3)


@pytest.mark.slow
def test_signal_while_the_model_loads(tmp_path, tiny_model_dir):
    """SIGTERM before training started: one line, exit 143, no run folder."""
    config = write_run_config(tmp_path, tiny_model_dir, max_steps=3)
    proc = run_driver(tmp_path, config, "grpokit.compose.policy:load_model", 1, "SIGTERM")
    assert proc.returncode == 143, proc.stderr
    assert stop_lines(proc.stderr) == ["grpokit: stopped by SIGTERM"]
    assert not (tmp_path / "run").exists()


def test_signal_handlers_are_restored_after_an_error(tmp_path, tiny_model_dir, monkeypatch):
    """A step that raises must not leave the trainer's handlers installed in the caller's process."""
    from grpokit.train.learning.learner import Learner

    def broken_update(self, *args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(Learner, "update", broken_update)
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    config = write_run_config(tmp_path, tiny_model_dir, max_steps=2)
    with pytest.raises(RuntimeError, match="boom"):
        main(["train", str(config)])
    assert {s: signal.getsignal(s) for s in before} == before
