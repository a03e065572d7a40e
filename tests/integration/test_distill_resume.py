"""A distillation run killed with SIGKILL after its second checkpoint and resumed equals the uninterrupted run: the
same per-step numbers, the same completions and the same teacher log-probs in the store (float32, one per token)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from shared_helpers import tiny_run_config
from test_distill import metrics, padded_teacher

from grpokit.cli import main
from grpokit.store import RolloutStore

pytestmark = pytest.mark.usefixtures("one_thread")
STEPS = 6
COMPARED = ("loss", "reward", "distill/reverse_kl", "distill/teacher_logprob_mean", "grad_norm", "entropy")


def run_config(tmp_path, model_dir, teacher, name: str) -> str:
    return str(
        tiny_run_config(
            tmp_path,
            model_dir,
            max_steps=STEPS,
            name=name,
            algo={"beta": 0.0, "teacher_model_name_or_path": str(teacher)},
            optim={"learning_rate": 1e-2, "lr_scheduler_type": "constant"},
            run={"save_steps": 1},
        )
    )


def stored(run):
    with RolloutStore(run / "rollouts.sqlite", readonly=True) as store:
        completions = [(r["step"], r["prompt_index"], r["completion_index"], r["completion"]) for r in store.rollouts()]
        return completions, store.teacher_logprobs()


def test_kill_9_then_resume_equals_the_straight_run(tmp_path, tiny_model_dir):
    padded_teacher(tmp_path / "teacher", tiny_model_dir)
    straight = run_config(tmp_path, tiny_model_dir, tmp_path / "teacher", "straight")
    assert main(["train", straight]) == 0
    killed = run_config(tmp_path, tiny_model_dir, tmp_path / "teacher", "killed")
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="1")
    log = (tmp_path / "killed.log").open("w")
    child = subprocess.Popen([sys.executable, "-m", "grpokit.cli", "train", killed], env=env, stdout=log, stderr=log)
    second = tmp_path / "killed" / "checkpoints" / "step-2"
    while not second.exists() and child.poll() is None:  # the kill lands anywhere after the second checkpoint
        time.sleep(0.05)
    child.send_signal(signal.SIGKILL)
    child.wait()
    assert main(["train", killed, "resume_from=latest"]) == 0
    a, b = metrics(tmp_path / "straight"), metrics(tmp_path / "killed")
    assert [m["step"] for m in a] == [m["step"] for m in b] == list(range(1, STEPS + 1))
    for x, y in zip(a, b):
        for key in COMPARED:
            assert x[key] == pytest.approx(y[key], abs=1e-6), (x["step"], key)
    (ca, ta), (cb, tb) = stored(tmp_path / "straight"), stored(tmp_path / "killed")
    assert ca == cb
    assert len(ta) == STEPS * 8 and ta.keys() == tb.keys()
    for key in ta:
        assert ta[key] == pytest.approx(tb[key], abs=1e-6), key


def test_a_resume_reuses_the_stored_teacher_logprobs(tmp_path, tiny_model_dir, monkeypatch):
    """A finished 6-step run resumed from its step-3 checkpoint does steps 4-6 again: the sampler draws the same tokens,
    so their teacher log-probs come from the store (no teacher call at all), and the steps equal the first run's."""
    from grpokit.train.teacher.distiller import Distiller
    from grpokit.train.teacher.local import LocalTeacher

    padded_teacher(tmp_path / "teacher", tiny_model_dir)
    path = run_config(tmp_path, tiny_model_dir, tmp_path / "teacher", "run")
    calls, steps = [], []
    scored, adjust = LocalTeacher.logprobs, Distiller.adjust
    monkeypatch.setattr(LocalTeacher, "logprobs", lambda self, *a: calls.append(1) or scored(self, *a))
    monkeypatch.setattr(Distiller, "adjust", lambda self, *a: steps.append(1) or adjust(self, *a))
    assert main(["train", path, "save_steps=3"]) == 0
    assert len(calls) == STEPS  # one teacher call a step
    first, (_, stored_first) = metrics(tmp_path / "run"), stored(tmp_path / "run")
    calls.clear(), steps.clear()
    assert main(["train", path, "save_steps=3", f"resume_from={tmp_path / 'run' / 'checkpoints' / 'step-3'}"]) == 0
    assert len(steps) == 3 and calls == []  # steps 4-6 done again, every row's tokens with stored teacher log-probs
    again, (_, stored_again) = metrics(tmp_path / "run"), stored(tmp_path / "run")
    assert [m["step"] for m in again] == list(range(1, STEPS + 1))
    for x, y in zip(first, again):
        for key in COMPARED:
            assert x[key] == pytest.approx(y[key], abs=1e-6), (x["step"], key)
    assert stored_again == stored_first
