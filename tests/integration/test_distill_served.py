"""A served teacher (grpokit/train/teacher/served.py) against the teacher server of grpokit/testing/teacher_server.py:
a tiny HTTP server answering vLLM's /v1/completions with prompt log-probs from a local model. Local and served
teachers give the same per-token log-probs (1e-5, float32); a teacher server that is gone or hangs ends the run in one
line naming it; the request is in flight during the step's reference pass."""

from __future__ import annotations

import socket
import threading

import pytest
import torch
from shared_helpers import tiny_run_config
from test_distill import metrics, padded_teacher

from grpokit.cli import main
from grpokit.rollout.types import Rollouts
from grpokit.testing.teacher_server import serve_teacher
from grpokit.train.teacher.local import LocalTeacher
from grpokit.train.teacher.served import ServedTeacher, TeacherServerError

pytestmark = pytest.mark.usefixtures("one_thread")


def serve(model, width: int, hang: threading.Event | None = None):
    """The teacher server of grpokit.testing on a free loopback port; returns (server, url)."""
    return serve_teacher(model, width, hang=hang)


@pytest.fixture()
def teacher(tmp_path, tiny_model_dir):
    model, tokenizer = padded_teacher(tmp_path / "teacher", tiny_model_dir)
    server, url = serve(model.eval(), len(tokenizer))
    yield model, tokenizer, url
    server.shutdown()


def test_local_and_served_teachers_agree_to_1e5(teacher):
    model, tokenizer, url = teacher
    prompts = [tokenizer.encode("w1 w2 w3"), tokenizer.encode("w4 w5")]
    completions = torch.tensor([[7, 8, 9], [10, 2, 0], [11, 12, 0], [13, 14, 15]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 1, 0], [1, 1, 1]]).float()
    rollouts = Rollouts(prompts, completions, mask, torch.zeros(completions.shape), ["stop"] * 4, 2)
    local = LocalTeacher(model, len(tokenizer), 1.0, 2).logprobs(rollouts, tokenizer.pad_token_id)
    served = ServedTeacher(url, 1.0, 30.0).logprobs(rollouts, tokenizer.pad_token_id)
    assert (local != 0).sum() == 10
    torch.testing.assert_close(served, local, atol=1e-5, rtol=0)


def test_a_run_with_a_served_teacher(tmp_path, tiny_model_dir, teacher):
    _, _, url = teacher
    path = tiny_run_config(
        tmp_path, tiny_model_dir, max_steps=2, name="served", algo={"beta": 0.0, "teacher_server_url": url}
    )
    assert main(["train", str(path)]) == 0
    steps = metrics(tmp_path / "served")
    assert len(steps) == 2 and all(m["distill/reverse_kl"] != 0 and m["distill/seconds"] > 0 for m in steps)


def test_a_teacher_server_that_is_gone_ends_the_run_in_one_line(tmp_path, tiny_model_dir, capsys):
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
    path = tiny_run_config(tmp_path, tiny_model_dir, max_steps=1, name="gone", algo={"teacher_server_url": url})
    assert main(["train", str(path)]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("grpokit: error")]
    assert len(err) == 1 and f"teacher server {url}: /v1/models failed" in err[0], err


def test_a_teacher_server_that_hangs_is_bounded(teacher):
    model, tokenizer, _ = teacher
    hang = threading.Event()
    server, url = serve(model, len(tokenizer), hang)
    try:
        client = ServedTeacher(url, 1.0, 0.5)
        hang.set()
        rollouts = Rollouts([[1, 4]], torch.tensor([[5, 6]]), torch.ones(1, 2), torch.zeros(1, 2), ["stop"], 1)
        with pytest.raises(TeacherServerError, match=r"did not answer within 0.5 s: the server hangs"):
            client.logprobs(rollouts, tokenizer.pad_token_id)
    finally:
        hang.clear()
        server.shutdown()


class Arrivals:
    """Counts the scoring requests that reached the server (a barrier on their number, not a clock)."""

    def __init__(self):
        self.count, self.changed = 0, threading.Condition()

    def set(self):
        with self.changed:
            self.count += 1
            self.changed.notify_all()

    def reached(self, n: int) -> bool:
        with self.changed:
            return self.changed.wait_for(lambda: self.count >= n, timeout=30)


def test_the_served_teacher_is_asked_while_the_reference_pass_runs(tmp_path, tiny_model_dir, monkeypatch):
    """Events, not time: each step's reference pass starts only once the teacher's request has reached the server
    (the server holds the answer until that pass is done), so the request is in flight during the pass."""
    from grpokit.train.learning.learner import Learner

    model, tokenizer = padded_teacher(tmp_path / "teacher", tiny_model_dir)
    arrivals, release = Arrivals(), threading.Event()
    server, url = serve_teacher(model.eval(), len(tokenizer), arrived=arrivals, release=release)
    reference, seen = Learner.reference_logprobs, []

    def after_the_request(self, batch):
        # reference pass k starts after the k-th request arrived; False: it came only after the pass (sequential)
        seen.append(arrivals.reached(len(seen) + 1))
        try:
            return reference(self, batch)
        finally:
            release.set()  # the server answers now (a later request passes straight through)

    monkeypatch.setattr(Learner, "reference_logprobs", after_the_request)
    try:
        path = tiny_run_config(
            tmp_path, tiny_model_dir, max_steps=2, name="overlap", algo={"beta": 0.04, "teacher_server_url": url}
        )
        assert main(["train", str(path)]) == 0
    finally:
        release.set()
        server.shutdown()
    assert seen == [True, True]
    steps = metrics(tmp_path / "overlap")
    assert all(m["distill/request_seconds"] > 0 and m["distill/seconds"] >= 0 for m in steps)


def test_the_served_teacher_sends_the_servers_key(teacher, tmp_path, monkeypatch):
    """A server that wants a key (as a default `grpokit vllm-serve`): the key file of a loopback port is found, a key
    given wins, and a wrong one is refused in one line naming teacher_server_api_key."""
    from grpokit.rollout.vllm.keys import key_path, url_port, write_key

    model, tokenizer, _ = teacher
    server, url = serve_teacher(model, len(tokenizer), key="right-key")
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    rollouts = Rollouts([[1, 4]], torch.tensor([[5, 6]]), torch.ones(1, 2), torch.zeros(1, 2), ["stop"], 1)
    try:
        with pytest.raises(TeacherServerError) as refused:  # no key anywhere
            ServedTeacher(url, 1.0, 30.0)
        assert f"teacher server {url}: /v1/models answered HTTP 401: no key was sent" in str(refused.value)
        write_key(key_path(url_port(url)), "right-key")
        assert (ServedTeacher(url, 1.0, 30.0).logprobs(rollouts, tokenizer.pad_token_id) < 0).all()  # the key file
        with pytest.raises(TeacherServerError) as refused:
            ServedTeacher(url, 1.0, 30.0, api_key="wrong")
        text = str(refused.value)
        assert "\n" not in text and "the key sent (teacher_server_api_key) is not its key" in text, text
    finally:
        server.shutdown()
