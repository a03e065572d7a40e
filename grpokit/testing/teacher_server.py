"""A teacher server for tests and benchmarks: vLLM's /v1/completions with prompt log-probs, answered by a local model
(grpokit/train/teacher/served.py's protocol), on a free loopback port, in a thread.

Each given sequence gets a full float32 forward of its own (no shared prompt cache: another computation than the
local teacher's). ``delay``: seconds each scoring request waits before answering (a slow teacher); ``hang``: while
it is set, requests wait for it to clear; ``arrived``: its ``set()`` is called when a scoring request arrives;
``release``: when given, a request waits until it is set (tests order events with these instead of timing them);
``key``: when given, a request without ``Authorization: Bearer KEY`` gets HTTP 401 (as a default ``grpokit
vllm-serve``).
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import torch


def serve_teacher(
    model, width: int, delay: float = 0.0, hang=None, arrived=None, release=None, batched=False, key=None
):
    """Start the server for ``model`` scored on its first ``width`` ids; returns (server, url). Stop it with
    ``server.shutdown()``. ``batched``: one right-padded forward for all of a request's sequences (fast, for a
    benchmark; batching changes float32 rounding slightly), else one forward each."""

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def _send(self, payload: dict, status: int = 200) -> None:
            body = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _refused(self) -> bool:
            if key is None or self.headers.get("Authorization") == f"Bearer {key}":
                return False
            self._send({"error": "Unauthorized"}, 401)
            return True

        def do_GET(self):
            if not self._refused():
                self._send({"data": [{"id": "teacher"}]})

        def do_POST(self):
            request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if self._refused():
                return
            if arrived is not None:
                arrived.set()
            if release is not None:
                release.wait(60)
            if delay:
                threading.Event().wait(delay)
            while hang is not None and hang.is_set():
                threading.Event().wait(0.05)
            sequences = request["prompt"]
            rows = _batched(model, width, sequences) if batched else [_logprobs(model, width, ids) for ids in sequences]
            self._send({"choices": [_choice(i, ids, row) for i, (ids, row) in enumerate(zip(sequences, rows))]})

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


@torch.no_grad()
def _logprobs(model, width: int, ids: list[int]) -> list[float]:
    """The log-prob of each of ``ids`` after the first, given the ones before it."""
    logits = model(torch.tensor([ids])).logits[0, :-1, :width].float()
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids[1:])[:, None]).squeeze(-1).tolist()


@torch.no_grad()
def _batched(model, width: int, sequences: list[list[int]]) -> list[list[float]]:
    """:func:`_logprobs` of every sequence from one forward, right-padded (causal: a pad after a token cannot change
    it)."""
    longest = max(len(ids) for ids in sequences)
    batch = torch.tensor([ids + [ids[-1]] * (longest - len(ids)) for ids in sequences])  # [n, longest]
    logp = torch.log_softmax(model(batch).logits[:, :-1, :width].float(), -1)
    picked = logp.gather(-1, batch[:, 1:, None]).squeeze(-1)  # [n, longest - 1]
    return [picked[i, : len(ids) - 1].tolist() for i, ids in enumerate(sequences)]


def _choice(index: int, ids: list[int], logprobs: list[float]) -> dict:
    entries = [None] + [{str(t): {"logprob": x, "rank": 1}} for t, x in zip(ids[1:], logprobs)]
    return {"index": index, "text": "", "prompt_logprobs": entries}
