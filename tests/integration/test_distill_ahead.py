"""A served teacher one step ahead: with rollouts sampled ahead (max_staleness 1, grpokit's sampler on its thread),
each batch's teacher request begins on the producer's thread once its rollouts are collected, so the request for step
t + 1's batch reaches the server while step t's update runs (events, not time), the learner sends no request of its own
(one request a batch), and the values it trains with are the teacher's for its rows (1e-5 against a local teacher)."""

from __future__ import annotations

import pytest
import torch
from shared_helpers import tiny_run_config
from test_distill import metrics, padded_teacher
from test_distill_served import Arrivals

from grpokit.cli import main
from grpokit.testing.teacher_server import serve_teacher
from grpokit.train.teacher.distiller import Distiller
from grpokit.train.teacher.local import LocalTeacher

pytestmark = pytest.mark.usefixtures("one_thread")
STEPS = 3


def test_the_served_teacher_scores_the_next_batch_while_a_step_trains(tmp_path, tiny_model_dir, monkeypatch):
    from grpokit.train.learning.learner import Learner

    model, tokenizer = padded_teacher(tmp_path / "teacher", tiny_model_dir)
    arrivals = Arrivals()
    server, url = serve_teacher(model.eval(), len(tokenizer), arrived=arrivals)
    update, seen, used = Learner.update, [], []

    def waiting_for_the_next_request(self, *args, **kwargs):
        # update t (t < STEPS) starts only when request t + 1 has arrived (the 1..K+1 first batches are admitted at
        # once); False: it comes after the update, from the learner's own step t + 1 (not ahead)
        if len(seen) < STEPS - 1:
            seen.append(arrivals.reached(len(seen) + 2))
        return update(self, *args, **kwargs)

    gathered = Distiller._gathered

    def keeping(self, rollouts, *args):  # the values the learner trains each step with, from the begun requests
        out = gathered(self, rollouts, *args)
        used.append((rollouts, out[0]))
        return out

    monkeypatch.setattr(Learner, "update", waiting_for_the_next_request)
    monkeypatch.setattr(Distiller, "_gathered", keeping)
    try:
        path = tiny_run_config(
            tmp_path, tiny_model_dir, max_steps=STEPS, name="ahead", algo={"beta": 0.0, "teacher_server_url": url}
        )
        assert main(["train", str(path), "max_staleness=1"]) == 0
    finally:
        server.shutdown()
    assert seen == [True] * (STEPS - 1)
    assert arrivals.count == STEPS  # one request a batch: the learner asked for none of the rows again
    steps = metrics(tmp_path / "ahead")
    assert len(steps) == STEPS and all(m["distill/reverse_kl"] != 0 for m in steps)
    local = LocalTeacher(model, len(tokenizer), 1.0, 8)
    assert len(used) == STEPS
    for rollouts, values in used:
        torch.testing.assert_close(values, local.logprobs(rollouts, tokenizer.pad_token_id), atol=1e-5, rtol=0)
