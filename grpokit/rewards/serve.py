"""``grpokit serve-rewards CONFIG_OR_REWARDS``: any rewards list over HTTP, in grpokit's format and OpenRLHF's.

The rewards run in a :class:`~grpokit.rewards.runner.RewardRunner` (built from the config or the reward specs by
:func:`grpokit.compose.rewards.served_reward_runner`), as in a run: each in its killable worker
process, ``reward_timeout`` per batch, failures as None plus an error. Endpoints:

- ``POST /score`` (also ``/``): grpokit's format (:mod:`grpokit.rewards.remote`), answered with the weighted sum
  (``rewards``), each completion's ``errors``, the ``log_extra`` columns (``extra``), the ``log_metric`` values
  (``metrics``) and each function's own values (``per_reward``);
- ``POST /openrlhf`` (also ``/get_reward``): OpenRLHF's ``{"query", "prompts", "labels"}``; the completion is the
  query after its prompt, the labels reach the functions as the ``label`` column (and ``answer``, as most built-ins
  read it);
- ``GET /health``: ``{"status": "ok", "rewards": [names]}``.

It binds to 127.0.0.1 unless told otherwise; bound to any other address it needs a shared token
(``--token``, or ``GRPOKIT_REWARD_TOKEN``), checked on every request (``Authorization: Bearer TOKEN``). One batch is
scored at a time (the workers hold one call each); requests wait their turn. SIGTERM or Ctrl-C stops accepting,
lets the requests in progress finish, ends the workers and exits (143 / 130).
"""

from __future__ import annotations

import hmac
import json
import math
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

from grpokit.rewards.contract import RewardError

if TYPE_CHECKING:
    from grpokit.rewards.runner import RewardRunner

TOKEN_ENV = "GRPOKIT_REWARD_TOKEN"  # read by the CLI
LOOPBACK = ("127.0.0.1", "localhost", "::1")
MAX_BODY = 256 << 20


def _json_value(value: float) -> float | None:
    return None if value is None or not math.isfinite(value) else value


class RewardService:
    """Scores requests with one runner, one batch at a time."""

    def __init__(self, runner: RewardRunner):
        self.runner = runner
        self._lock = threading.Lock()
        self.served = 0

    def score(self, prompts: list, completions: list, columns: dict[str, list]) -> dict[str, Any]:
        n = len(completions)
        if len(prompts) != n or any(not isinstance(v, list) or len(v) != n for v in columns.values()):
            raise ValueError(f"prompts and every column need one value per completion ({n})")
        with self._lock:
            values = self.runner.score_values(prompts, completions, columns)
            result = self.runner.combine(values)
            self.served += 1
        return {
            "rewards": [_json_value(v) for v in result.combined.tolist()],
            "errors": result.errors,
            "extra": json.loads(json.dumps(result.extra, default=str)),
            "metrics": result.logged,
            "per_reward": {
                name: [_json_value(v) for v in result.per_func[:, f].tolist()] for f, name in enumerate(result.names)
            },
        }

    def score_openrlhf(self, body: dict) -> dict[str, Any]:
        queries, prompts = body.get("query"), body.get("prompts")
        if not isinstance(queries, list) or not all(isinstance(q, str) for q in queries):
            raise ValueError("an OpenRLHF request needs 'query': a list of strings (prompt + completion)")
        prompts = prompts if isinstance(prompts, list) and len(prompts) == len(queries) else [""] * len(queries)
        completions = [q[len(p) :] if isinstance(p, str) and q.startswith(p) else q for q, p in zip(queries, prompts)]
        labels = body.get("labels")
        columns = {}
        if isinstance(labels, list) and len(labels) == len(queries):
            columns = {"label": labels, "answer": labels}
        answer = self.score([str(p) for p in prompts], completions, columns)
        logs = {name: values for name, values in answer["per_reward"].items()}
        return {"rewards": answer["rewards"], "scores": answer["rewards"], "extra_logs": logs}


def make_handler(service: RewardService, token: str | None):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # quiet: one line per request is noise
            return

        def _send(self, status: int, body: Any) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _allowed(self) -> bool:
            if token is None:
                return True
            given = self.headers.get("Authorization", "")
            if hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
                return True
            self._send(401, {"error": "missing or wrong token (Authorization: Bearer TOKEN)"})
            return False

        def do_GET(self) -> None:
            if not self._allowed():
                return
            if self.path.rstrip("/") == "/health":
                self._send(200, {"status": "ok", "rewards": list(service.runner.names)})
            else:
                self._send(404, {"error": f"no {self.path}: GET /health, POST /score or /openrlhf"})

        def do_POST(self) -> None:
            if not self._allowed():
                return
            length = int(self.headers.get("Content-Length") or 0)
            if length > MAX_BODY:
                self._send(413, {"error": f"a request may carry {MAX_BODY} bytes at most"})
                return
            try:
                body = json.loads(self.rfile.read(length) or b"null")
                path = self.path.rstrip("/") or "/"
                if path in ("/", "/score"):
                    if not isinstance(body, dict) or not isinstance(body.get("completions"), list):
                        raise ValueError("a grpokit request needs 'prompts' and 'completions' lists")
                    completions = body["completions"]
                    prompts = body.get("prompts") or [""] * len(completions)
                    answer = service.score(prompts, completions, dict(body.get("columns") or {}))
                elif path in ("/openrlhf", "/get_reward"):
                    if not isinstance(body, dict):
                        raise ValueError("an OpenRLHF request is a JSON object")
                    answer = service.score_openrlhf(body)
                else:
                    self._send(404, {"error": f"no {self.path}: POST /score or /openrlhf, GET /health"})
                    return
            except (ValueError, RewardError) as exc:
                self._send(400, {"error": str(exc)})
                return
            self._send(200, answer)

    return Handler


class RewardServer(ThreadingHTTPServer):
    # Connections are kept alive by clients between batches, so a stop does not wait for their threads; it waits
    # for the batch being scored instead (:func:`stop`).
    daemon_threads = True
    allow_reuse_address = True
    service: RewardService


def stop(server: RewardServer) -> None:
    """Stop accepting, wait for the batch being scored (its answer is sent), close the socket."""
    server.shutdown()
    with server.service._lock:
        server.server_close()


def check_binding(host: str, token: str | None) -> None:
    if host not in LOOPBACK and not token:
        raise RewardError(
            f"serve-rewards bound to {host} needs a shared token: pass --token TOKEN or set {TOKEN_ENV} (clients send "
            "it as headers: {Authorization: Bearer TOKEN}); or bind to 127.0.0.1"
        )


def serve(runner: RewardRunner, host: str = "127.0.0.1", port: int = 0, token: str | None = None) -> RewardServer:
    """A started server (on a background thread) scoring with ``runner``; :func:`stop` stops it."""
    check_binding(host, token)
    service = RewardService(runner)
    server = RewardServer((host, port), make_handler(service, token))
    server.service = service
    threading.Thread(target=server.serve_forever, name="grpokit-serve-rewards", daemon=True).start()
    return server


def run_server(runner: RewardRunner, host: str, port: int, token: str | None) -> int:
    """``grpokit serve-rewards``' server over ``runner`` (built by
    :func:`grpokit.compose.rewards.served_reward_runner`): announces itself, serves until a signal ends the
    command, then stops and closes the runner."""
    server = None
    try:
        server = serve(runner, host, port, token)
        host, port = server.server_address[:2]
        print(
            f"grpokit: serving rewards {', '.join(runner.names)} on http://{host}:{port} "
            "(grpokit: POST /score; OpenRLHF: POST /openrlhf; GET /health)",
            flush=True,
        )
        threading.Event().wait()  # until a signal ends the command
    finally:
        if server is not None:
            stop(server)
        runner.close()
    return 0
