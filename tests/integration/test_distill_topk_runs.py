"""The teacher's top-k terms through the CLI on tiny models (a local teacher with a padded vocabulary): runs with
distill_loss forward_kl_topk and jsd log finite divergences, and a resume computes the top-k of the steps it does
again with the local teacher (not stored), giving the first run's numbers."""

from __future__ import annotations

import math

import pytest
from test_distill import config, metrics, padded_teacher

from grpokit.cli import main

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("loss", ["forward_kl_topk", "jsd"])
def test_a_top_k_run_logs_finite_divergences(tmp_path, tiny_model_dir, loss):
    padded_teacher(tmp_path / "teacher", tiny_model_dir)
    path = config(tmp_path, tiny_model_dir, str(tmp_path / "teacher"), loss, steps=2, distill_loss=loss, distill_topk=5)
    assert main(["train", path]) == 0
    steps = metrics(tmp_path / loss)
    assert [m["step"] for m in steps] == [1, 2]
    for m in steps:
        for key in (f"distill/{loss}", "distill/reverse_kl", "loss", "grad_norm"):
            assert math.isfinite(m[key]), (m["step"], key)
        assert m[f"distill/{loss}"] > 0  # a teacher far from the student


def test_a_resume_recomputes_the_top_k_with_the_local_teacher(tmp_path, tiny_model_dir, monkeypatch):
    """A 4-step jsd run resumed from its step-2 checkpoint: steps 3-4 are done again, the teacher scores them again
    (one call a step: the top-k is not in the store), and their numbers equal the first run's."""
    from grpokit.train.teacher.local import LocalTeacher

    padded_teacher(tmp_path / "teacher", tiny_model_dir)
    path = config(tmp_path, tiny_model_dir, str(tmp_path / "teacher"), "run", steps=4, distill_loss="jsd")
    calls = []
    scored = LocalTeacher.scored
    monkeypatch.setattr(LocalTeacher, "scored", lambda self, *a: calls.append(a[-1]) or scored(self, *a))
    assert main(["train", path, "save_steps=2"]) == 0
    assert calls == [20] * 4  # distill_topk's default, one pass a step
    first = metrics(tmp_path / "run")
    calls.clear()
    assert main(["train", path, "save_steps=2", f"resume_from={tmp_path / 'run' / 'checkpoints' / 'step-2'}"]) == 0
    assert calls == [20] * 2
    again = metrics(tmp_path / "run")
    assert [m["step"] for m in again] == [1, 2, 3, 4]
    for x, y in zip(first, again):
        for key in ("distill/jsd", "distill/reverse_kl", "distill/teacher_logprob_mean", "loss", "grad_norm"):
            assert x[key] == pytest.approx(y[key], abs=1e-6), (x["step"], key)
