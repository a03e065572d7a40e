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
- ``GET /health``: ``{"status": "ok", "rewards": [names]}``;
- ``GET /metrics``: requests, errors, queue depth and latency in Prometheus' text format
  (:mod:`grpokit.rewards.serve_queue`).

Every request gets a status and a JSON ``{"error": reason}`` when refused: 4xx for a client's mistake (the body
checked at every level by :mod:`grpokit.rewards.serve_requests`; 401 without the token, 404 an unknown path, 405 an
unknown method, 408 a body not sent within ``request_timeout``, 411 no Content-Length, 413 a body over ``max_body``,
refused before it is read), 503 with ``Retry-After`` when ``max_queue`` requests wait already, 500 only for the
server's own fault (with its traceback in the log). A client's mistake leaves no traceback in the log.

It binds to 127.0.0.1 unless told otherwise; bound to any other address it needs a shared token
(``$GRPOKIT_REWARD_TOKEN`` or ``--token-file``, never ``--token``: grpokit/rewards/serve_token.py), checked on
every request (``Authorization: Bearer TOKEN``). One batch is
scored at a time (the workers hold one call each); requests wait their turn, first come first served. With
``certfile`` and ``keyfile`` it speaks HTTPS (and with ``client_ca``, requires client certificates signed by it).
SIGTERM or Ctrl-C stops accepting, lets the requests in progress finish, ends the workers and exits (143 / 130).
"""

from __future__ import annotations

import hmac
import json
import math
import ssl
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from grpokit.rewards.contract import RewardError
from grpokit.rewards.serve_queue import ServerMetrics, TurnQueue
from grpokit.rewards.serve_requests import BadRequest, grpokit_request, openrlhf_request, parse_body
from grpokit.rewards.serve_token import TOKEN_ENV

if TYPE_CHECKING:
    from grpokit.rewards.runner import RewardRunner

LOOPBACK = ("127.0.0.1", "localhost", "::1")
MAX_BODY = 64 << 20
# path -> (route, methods); the route names the metrics' label (unknown paths count as "other")
ROUTES = {
    "/": ("score", "POST"),
    "/score": ("score", "POST"),
    "/openrlhf": ("openrlhf", "POST"),
    "/get_reward": ("openrlhf", "POST"),
    "/health": ("health", "GET"),
    "/metrics": ("metrics", "GET"),
}
SERVED = "GET /health or /metrics, POST /score or /openrlhf"


def _json_value(value: float) -> float | None:
    return None if value is None or not math.isfinite(value) else value


class RewardService:
    """Scores requests with one runner, one batch at a time, in arrival order (at most ``max_queue`` waiting)."""

    def __init__(self, runner: RewardRunner, max_queue: int = 16):
        self.runner = runner
        self.queue = TurnQueue(max_queue)
        self.metrics = ServerMetrics()
        self._lock = self.queue.lock  # held while a batch is scored (stop waits on it)
        self.served = 0

    def score(self, prompts: list, completions: list, columns: dict[str, list]) -> dict[str, Any]:
        n = len(completions)
        if n == 0:
            return {"rewards": [], "errors": [], "extra": {}, "metrics": {}, "per_reward": {}}
        began = time.monotonic()
        with self.queue.turn():
            values = self.runner.score_values(prompts, completions, columns)
            result = self.runner.combine(values)
            self.served += 1
        errors = sum(e is not None for e in result.errors)
        self.metrics.scored(time.monotonic() - began, n, errors)
        return {
            "rewards": [_json_value(v) for v in result.combined.tolist()],
            "errors": result.errors,
            "extra": json.loads(json.dumps(result.extra, default=str)),
            "metrics": {k: [_json_value(v) for v in vs] for k, vs in result.logged.items()},
            "per_reward": {
                name: [_json_value(v) for v in result.per_func[:, f].tolist()] for f, name in enumerate(result.names)
            },
        }

    def score_openrlhf(self, body: Any) -> dict[str, Any]:
        answer = self.score(*openrlhf_request(body))
        logs = {name: values for name, values in answer["per_reward"].items()}
        return {"rewards": answer["rewards"], "scores": answer["rewards"], "extra_logs": logs}

    def answer(self, route: str, body: bytes) -> dict[str, Any]:
        value = parse_body(body)
        if route == "openrlhf":
            return self.score_openrlhf(value)
        return self.score(*grpokit_request(value))


class RewardHandler(BaseHTTPRequestHandler):
    """One connection's requests (module docstring); :func:`make_handler` binds the service and the settings."""

    service: RewardService
    token: str | None = None
    max_body: int = MAX_BODY
    protocol_version = "HTTP/1.1"
    default_request_version = "HTTP/1.0"  # a malformed request line still gets a status line
    timeout = 60.0  # each read of a request: a client that stops sending gets 408 or is dropped
    _route = "other"
    _unread = False  # a body announced and not read: the connection closes after the answer

    def log_message(self, format: str, *args: Any) -> None:  # quiet: one line per request is noise
        return

    def setup(self) -> None:
        super().setup()
        if isinstance(self.connection, ssl.SSLSocket):  # the handshake here, on this request's thread
            self.connection.do_handshake()

    def _send(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
        if isinstance(body, str):
            data, kind = body.encode(), "text/plain; version=0.0.4; charset=utf-8"
        else:
            data, kind = json.dumps(body).encode(), "application/json"
        self.service.metrics.answered(self._route, status)
        try:
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(data)))
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            if self._unread or self.close_connection:
                self.close_connection = True
                self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(data)
        except OSError:  # the client went away: nothing to tell it
            self.close_connection = True

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """The standard library's own refusals (bad request line, headers, version, method) as JSON 4xx."""
        code = {HTTPStatus.NOT_IMPLEMENTED: 405, HTTPStatus.HTTP_VERSION_NOT_SUPPORTED: 400}.get(code, int(code))
        if code == 405:
            message = f"method {self.command!r} is not served: {SERVED}"
        self.close_connection = True
        headers = {"Allow": "GET, POST"} if code == 405 else None
        self._send(code, {"error": message or HTTPStatus(code).phrase}, headers)

    def _allowed(self) -> None:
        if self.token is None:
            return
        given = self.headers.get("Authorization", "")
        if not hmac.compare_digest(given.encode("utf-8", "replace"), f"Bearer {self.token}".encode()):
            raise BadRequest(401, "missing or wrong token (Authorization: Bearer TOKEN)")

    def _read_body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            self._unread = True
            raise BadRequest(411, "send the body with a Content-Length (chunked bodies are not read)")
        given = self.headers.get_all("Content-Length") or ["0"]
        if len(set(given)) != 1 or not given[0].strip().isdigit():
            self._unread = True
            raise BadRequest(400, f"Content-Length must be one number of bytes, got {', '.join(given)[:100]!r}")
        length = int(given[0])
        if length > self.max_body:
            self._unread = True
            raise BadRequest(413, f"the body has {length} bytes, over this server's --max-body ({self.max_body})")
        try:
            data = self.rfile.read(length)
        except TimeoutError:
            self._unread = True
            raise BadRequest(408, f"the body was not sent within {self.timeout:g} s") from None
        if len(data) < length:
            self._unread = True
            raise BadRequest(400, f"the body ended after {len(data)} of its {length} bytes")
        return data

    def _handle(self, method: str) -> None:
        path = urlsplit(self.path).path.rstrip("/") or "/"
        route, allowed = ROUTES.get(path, ("other", None))
        self._route = route
        announced = self.headers.get("Content-Length", "").strip() not in ("", "0")
        self._unread = announced or "Transfer-Encoding" in self.headers  # until the body is read
        try:
            self._allowed()
            if allowed is None:
                raise BadRequest(404, f"no {path[:200]}: {SERVED}")
            if method != allowed:
                raise BadRequest(405, f"{path} takes {allowed}, not {method}", {"Allow": allowed})
            if route == "health":
                self._send(200, {"status": "ok", "rewards": list(self.service.runner.names)})
            elif route == "metrics":
                self._send(200, self.service.metrics.render(self.service.queue))
            else:
                data = self._read_body()
                self._unread = False
                self._send(200, self.service.answer(route, data))
        except BadRequest as exc:
            self._send(exc.status, {"error": str(exc)}, exc.headers)
        except Exception as exc:  # the server's own fault, not the client's: logged with its traceback
            traceback.print_exc(file=sys.stderr)
            self._send(500, {"error": f"the reward server failed: {type(exc).__name__}: {str(exc)[:300]}"})

    def do_GET(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")


def make_handler(service: RewardService, token: str | None, max_body: int = MAX_BODY, request_timeout: float = 60.0):
    """The handler class of one server: :class:`RewardHandler` bound to ``service`` and the settings."""
    settings = {"service": service, "token": token, "max_body": max_body, "timeout": request_timeout}
    return type("Handler", (RewardHandler,), settings)


class RewardServer(ThreadingHTTPServer):
    # Connections are kept alive by clients between batches, so a stop does not wait for their threads; it waits
    # for the batch being scored instead (:func:`stop`).
    daemon_threads = True
    allow_reuse_address = True
    service: RewardService

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A connection's error outside a request's handling: a client that hung up, timed out or failed the TLS
        handshake (OSError, ssl.SSLError included) is its own business, not logged; anything else is a fault here."""
        if isinstance(sys.exc_info()[1], OSError):
            return
        super().handle_error(request, client_address)


@dataclass(frozen=True)
class ServeOptions:
    """serve-rewards' limits and TLS (the CLI's flags)."""

    max_body: int = MAX_BODY  # bytes of a request body; a longer one gets 413 before it is read
    max_queue: int = 16  # requests waiting for their turn; one more gets 503 with Retry-After
    request_timeout: float = 60.0  # seconds for each read of a request; a client that stops sending gets 408
    certfile: str | None = None  # PEM certificate (chain): serve HTTPS
    keyfile: str | None = None  # its PEM private key
    client_ca: str | None = None  # PEM CA bundle: require client certificates it signed (mutual TLS)

    def check(self) -> None:
        if self.max_body < 1 or self.max_queue < 0 or self.request_timeout <= 0:
            raise RewardError("serve-rewards: --max-body >= 1, --max-queue >= 0 and --request-timeout > 0")
        if (self.certfile is None) != (self.keyfile is None):
            raise RewardError("serve-rewards: --certfile and --keyfile go together (the certificate and its key)")
        if self.client_ca is not None and self.certfile is None:
            raise RewardError(
                "serve-rewards: --client-ca needs --certfile and --keyfile (client certificates need TLS)"
            )

    def tls_context(self) -> ssl.SSLContext | None:
        if self.certfile is None:
            return None
        try:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(self.certfile, self.keyfile)
            if self.client_ca is not None:
                context.verify_mode = ssl.CERT_REQUIRED
                context.load_verify_locations(self.client_ca)
        except (OSError, ssl.SSLError) as exc:
            raise RewardError(
                f"serve-rewards: cannot load --certfile {self.certfile} / --keyfile {self.keyfile} / --client-ca "
                f"{self.client_ca} ({exc}): give PEM files that exist and belong together"
            ) from None
        return context


def stop(server: RewardServer) -> None:
    """Stop accepting, wait for the batch being scored (its answer is sent), close the socket."""
    server.shutdown()
    with server.service._lock:
        server.server_close()


def check_binding(host: str, token: str | None) -> None:
    if host not in LOOPBACK and not token:
        raise RewardError(
            f"serve-rewards bound to {host} needs a shared token: set {TOKEN_ENV} or pass --token-file FILE "
            "(clients send it as headers: {Authorization: Bearer TOKEN}); or bind to 127.0.0.1"
        )


def serve(
    runner: RewardRunner,
    host: str = "127.0.0.1",
    port: int = 0,
    token: str | None = None,
    options: ServeOptions | None = None,
) -> RewardServer:
    """A started server (on a background thread) scoring with ``runner``; :func:`stop` stops it."""
    options = options or ServeOptions()
    options.check()
    check_binding(host, token)
    context = options.tls_context()
    service = RewardService(runner, options.max_queue)
    server = RewardServer((host, port), make_handler(service, token, options.max_body, options.request_timeout))
    server.service = service
    if context is not None:  # the handshake happens on each request's thread (Handler.setup), not in accept
        server.socket = context.wrap_socket(server.socket, server_side=True, do_handshake_on_connect=False)
    threading.Thread(target=server.serve_forever, name="grpokit-serve-rewards", daemon=True).start()
    return server


def run_server(
    runner: RewardRunner, host: str, port: int, token: str | None, options: ServeOptions | None = None
) -> int:
    """``grpokit serve-rewards``' server over ``runner`` (built by
    :func:`grpokit.compose.rewards.served_reward_runner`): announces itself, serves until a signal ends the
    command, then stops and closes the runner."""
    server = None
    try:
        server = serve(runner, host, port, token, options)
        host, port = server.server_address[:2]
        scheme = "https" if options is not None and options.certfile else "http"
        print(
            f"grpokit: serving rewards {', '.join(runner.names)} on {scheme}://{host}:{port} "
            "(grpokit: POST /score; OpenRLHF: POST /openrlhf; GET /health, /metrics)",
            flush=True,
        )
        threading.Event().wait()  # until a signal ends the command
    finally:
        if server is not None:
            stop(server)
        runner.close()
    return 0
