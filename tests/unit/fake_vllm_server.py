"""A tiny stand-in for ``vllm serve`` on a loopback port, for the server client's tests: the routes grpokit calls,
each answering as vLLM 0.32's do (shapes read from its source), and a record of the calls. ``hang``: a route whose
handler blocks until the server stops (a hung server); ``fail``: a route answering HTTP 500. ``overlaps``: each
request that ran beside a weight push (a push while anything else ran, or a sampling while a push ran), with the
routes in flight when it arrived; ``push_dwell_s``: how long a push takes (a wider window for such an overlap).
``pushed_norms``: the sum of ``model.norm.weight`` in each pushed folder, in order (which weights arrived).
``key``: the server's key, required as ``grpokit vllm-serve`` requires it (every route but ``/health``: HTTP 401
without it); ``authorization``: the ``Authorization`` header of each call, in order."""

from __future__ import annotations

import json
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PUSH_ROUTES = ("/collective_rpc", "/reset_prefix_cache", "/start_weight_update", "/update_weights",
               "/finish_weight_update")  # fmt: skip


class FakeVLLM:
    def __init__(self, logprobs_mode="processed_logprobs", dtype="torch.float32", dev_mode=True, extension=None,
                 key=None):  # fmt: skip
        self.calls: list[tuple[str, dict | None]] = []
        self.key = key
        self.authorization: list[tuple[str, str | None]] = []
        self.folders_seen: list[tuple[str, list[str]]] = []  # (weights folder, its files at the reload)
        self.hang: set[str] = set()
        self.overlaps: list[tuple[str, list[str]]] = []
        self.in_flight: list[str] = []
        self.push_dwell_s = 0.0
        self.pushed_norms: list[float] = []
        self.lock = threading.Lock()
        self.fail: set[str] = set()
        self.released = threading.Event()
        self.info = {
            "vllm_config": {
                "model_config": {"logprobs_mode": logprobs_mode, "dtype": dtype},
                "parallel_config": {"worker_extension_cls": extension or ""},
            }
        }
        self.dev_mode = dev_mode
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _answer(self, code: int, body=None):
                data = b"" if body is None else json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _route(self, method: str):
                route = self.path.split("?")[0]
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length)) if length else None
                given = self.headers.get("Authorization")
                with fake.lock:
                    fake.authorization.append((route, given))
                if fake.key is not None and route != "/health" and given != f"Bearer {fake.key}":
                    return self._answer(401, {"error": "Unauthorized"})
                with fake.lock:
                    fake.calls.append((route, body))
                    others = list(fake.in_flight)
                    fake.in_flight.append(route)
                    pushing = route in PUSH_ROUTES
                    if (pushing and others) or (route == "/v1/completions" and set(others) & set(PUSH_ROUTES)):
                        fake.overlaps.append((route, others))
                try:
                    reply = self._handle(method, route, body)
                finally:
                    with fake.lock:  # done before the answer leaves: the client may send its next request at once
                        fake.in_flight.remove(route)
                if reply is not None:
                    self._answer(*reply)

            def _handle(self, method: str, route: str, body):
                if route in fake.hang:
                    fake.released.wait()  # until the test stops the server: a server that never answers
                    return None
                if route in fake.fail:
                    return 500, {"error": "boom"}
                answer = fake.answer(method, route, body)
                return (404, {"detail": "Not Found"}) if answer is None else answer

            def do_GET(self):
                self._route("GET")

            def do_POST(self):
                self._route("POST")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def answer(self, method: str, route: str, body):
        if route == "/health":
            return 200, None
        if route == "/v1/models":
            return 200, {"data": [{"id": "tiny"}]}
        if route == "/server_info" and self.dev_mode:
            return 200, self.info
        if route == "/collective_rpc" and self.dev_mode:
            from safetensors.torch import load_file

            folder = body["kwargs"]["weights_path"]
            self.folders_seen.append((folder, sorted(os.listdir(folder))))
            weights = load_file(os.path.join(folder, "model.safetensors"))
            if "model.norm.weight" in weights:
                self.pushed_norms.append(float(weights["model.norm.weight"].sum()))
            time.sleep(self.push_dwell_s)
            return 200, {"results": ["1"]}
        if route == "/reset_prefix_cache" and self.dev_mode:
            return 200, {"success": True}
        if route == "/get_world_size":
            return 200, {"world_size": 1}
        weight_routes = ("/init_weight_transfer_engine", "/start_weight_update", "/update_weights")
        if route in (*weight_routes, "/finish_weight_update", "/shutdown_weight_transfer_engine"):
            return 200, {"message": "ok"}
        if route == "/v1/completions":
            return 200, self.completions(body)
        return None

    @staticmethod
    def completions(body: dict) -> dict:
        """n choices of min(max_tokens, 3) tokens, each a function of the seed and the choice's index."""
        length = min(body["max_tokens"], 3)
        choices = []
        for i in range(body["n"]):
            tokens = [3 + (body["seed"] + i + t) % 30 for t in range(length)]
            choices.append(
                {
                    "index": i,
                    "text": "",
                    "token_ids": tokens,
                    "logprobs": {"tokens": [f"token_id:{t}" for t in tokens], "token_logprobs": [-0.5] * length},
                    "finish_reason": "length",
                }
            )
        return {"choices": choices}

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.released.set()
        self.server.shutdown()
        self.server.server_close()
