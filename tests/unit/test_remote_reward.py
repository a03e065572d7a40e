"""RemoteReward's formats against a stdlib server (slime: one request per completion, a number or a dict), and
a function's own per-completion errors (log_errors) stored by the runner."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from grpokit.rewards import RewardRunner
from grpokit.rewards.remote import RemoteReward


@pytest.fixture
def slime_server():
    requests = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            requests.append(body)
            answer = {"score": float(body["label"] in body["response"])} if body["label"] != "raw" else 0.25
            if body["label"] == "bad":
                answer = {"score": "high"}
            data = json.dumps(answer).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/", requests
    server.shutdown()
    server.server_close()


def test_slime_posts_one_sample_each_and_reads_a_number_or_the_reward_key(slime_server):
    url, requests = slime_server
    reward = RemoteReward(url, format="slime", reward_key="score", retries=0)
    logged, errors = {}, []
    values = reward(
        prompts=["p1", "p2", "p3", "p4"],
        completions=["is 7", "is 8", "x", "y"],
        label=["7", "7", "raw", "bad"],
        log_metric=lambda name, value: logged.setdefault(name, []).append(value),
        log_errors=errors.extend,
    )
    assert values == [1.0, 0.0, 0.25, None]
    assert sorted(r["response"] for r in requests) == ["is 7", "is 8", "x", "y"]
    assert {"prompt": "p1", "response": "is 7", "label": "7"} in requests
    assert errors[:3] == [None, None, None] and "'high' where a number was expected" in errors[3]
    # the request was answered: only its value was wrong (an error for that completion, not a failed request)
    assert logged["remote/request_errors"] == [0] and logged["remote/retries"] == [0]


def test_a_functions_own_errors_are_stored_and_counted():
    def partial(completions, log_errors, **kwargs):
        log_errors([None, "the judge had no opinion"])
        return [1.0, None]

    with RewardRunner([partial], isolate=False) as runner:
        result = runner.score(["a", "b"], ["x", "y"])
    assert result.errors == [None, "partial: the judge had no opinion"]
    assert result.error_counts == {"partial": 1}
