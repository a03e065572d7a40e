"""A served teacher (grpokit/train/teacher/served.py) against a teacher server written here: a tiny HTTP server
answering vLLM's /v1/completions with prompt log-probs from a local model. Local and served teachers give the same
per-token log-probs (1e-5, float32); a teacher server that is gone or hangs ends the run in one line naming it."""

from __future__ import annotations

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch
from shared_helpers import tiny_run_config
from test_distill import metrics, padded_teacher

from grpokit.cli import main
from grpokit.rollout.types import Rollouts
from grpokit.train.teacher.local import LocalTeacher
from grpokit.train.teacher.served import ServedTeacher, TeacherServerError

pytestmark = pytest.mark.usefixtures("one_thread")


def serve(model, width: int, hang: threading.Event | None = None):
    """A teacher server on a free loopback port: vLLM's prompt log-probs of each given sequence, float32, full
    forward (no shared prompt cache: another computation than the local teacher's). ``hang``: while set, requests
    to /v1/completions wait for it to clear. Returns (server, url)."""

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def _send(self, payload: dict) -> None:
            body = json.dumps(payload).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            self._send({"data": [{"id": "teacher"}]})

        def do_POST(self):
            request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            while hang is not None and hang.is_set():
                threading.Event().wait(0.05)
            choices = []
            for i, ids in enumerate(request["prompt"]):
                with torch.no_grad():
                    logits = model(torch.tensor([ids])).logits[0, :-1, :width].float()
                picked = torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids[1:])[:, None]).squeeze(-1)
                entries = [None] + [{str(t): {"logprob": float(x), "rank": 1}} for t, x in zip(ids[1:], picked)]
                choices.append({"index": i, "text": "", "prompt_logprobs": entries})
            self._send({"choices": choices})

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


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
