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
checked at every level by :mod:`grpokit.rewards.serve_requests`; 400 a malformed request line or header, 401 without
the token, 404 an unknown path, 405 an unknown method, 408 a body not sent within ``request_timeout`` or a request
line and headers not within ``header_timeout``, 411 a chunked body, 413 a body over ``max_body``, refused before it is
read, 431 headers over 64 KiB), 503 with ``Retry-After`` when ``max_queue`` requests are admitted already (or
``max_connections`` are open), 500 only for the server's own fault (with its traceback in the log). A client's mistake
leaves no traceback in the log.

The server is uvicorn (h11) on one event loop, in a thread of its own (:class:`RewardServer`): connections cost no
thread. Its HTTP limits are :mod:`grpokit.rewards.serve_protocol`'s, the routes :mod:`grpokit.rewards.serve_app`'s.
A request's body is read only once it has a place in the queue, parsed on a parse thread, scored on the batch thread.

It binds to 127.0.0.1 unless told otherwise; bound to any other address it needs a shared token
(``$GRPOKIT_REWARD_TOKEN`` or ``--token-file``, never ``--token``: grpokit/rewards/serve_token.py), checked on
every request (``Authorization: Bearer TOKEN``). One batch is
scored at a time (the workers hold one call each); requests wait their turn, first come first served. With
``certfile`` and ``keyfile`` it speaks HTTPS (and with ``client_ca``, requires client certificates signed by it).
SIGTERM or Ctrl-C stops accepting, closes idle connections, lets the requests in progress finish, ends the workers
and exits (143 / 130).
"""

from __future__ import annotations

import resource
import socket
import threading
from typing import TYPE_CHECKING, Any

from grpokit.rewards.contract import RewardError
from grpokit.rewards.serve_service import RewardService
from grpokit.rewards.serve_settings import MAX_HEADER_BYTES, ServeOptions
from grpokit.rewards.serve_token import TOKEN_ENV

if TYPE_CHECKING:
    from grpokit.rewards.runner import RewardRunner

__all__ = ["RewardServer", "RewardService", "ServeOptions", "check_binding", "run_server", "serve", "stop"]
LOOPBACK = ("127.0.0.1", "localhost", "::1")


class RewardServer:
    """uvicorn serving a :class:`~grpokit.rewards.serve_app.RewardApp` on a bound socket, its event loop on one
    thread; ``server_address`` is the socket's (port 0 picks a free one)."""

    def __init__(self, service: RewardService, sock: socket.socket, config: Any):
        import uvicorn

        self.service = service
        self.socket = sock
        self.server_address = sock.getsockname()[:2]
        self.uvicorn = uvicorn.Server(config)
        self.thread = threading.Thread(
            target=self.uvicorn.run, kwargs={"sockets": [sock]}, name="grpokit-serve-rewards", daemon=True
        )


def stop(server: RewardServer) -> None:
    """Stop accepting, close idle connections, let the requests in progress finish (their answers are sent), end
    the event loop's thread, then the parse and batch threads."""
    server.uvicorn.should_exit = True
    if server.thread.is_alive():
        server.thread.join()
    server.socket.close()
    server.service.close()


def check_binding(host: str, token: str | None) -> None:
    if host not in LOOPBACK and not token:
        raise RewardError(
            f"serve-rewards bound to {host} needs a shared token: set {TOKEN_ENV} or pass --token-file FILE "
            "(clients send it as headers: {Authorization: Bearer TOKEN}); or bind to 127.0.0.1"
        )


def _uvicorn():
    try:
        import uvicorn
    except ImportError:
        raise RewardError("serve-rewards needs uvicorn: pip install 'grpokit[remote]'") from None
    return uvicorn


def _config(app: Any, service: RewardService, options: ServeOptions, context: Any) -> Any:
    """uvicorn's settings: the h11 protocol with serve-rewards' limits, one event loop, no logging of its own."""
    uvicorn = _uvicorn()
    from grpokit.rewards.serve_protocol import BoundedH11Protocol

    limits = {
        "header_timeout": options.header_timeout,
        "max_connections": options.max_connections,
        "on_refused": staticmethod(lambda status: service.metrics.answered("other", status)),
    }
    return uvicorn.Config(
        app,
        http=type("Protocol", (BoundedH11Protocol,), limits),
        loop="asyncio",
        interface="asgi3",
        lifespan="off",
        log_config=None,
        log_level="error",
        access_log=False,
        proxy_headers=False,
        server_header=False,
        timeout_keep_alive=options.keep_alive_timeout,
        h11_max_incomplete_event_size=MAX_HEADER_BYTES,
        backlog=min(options.max_connections, 4096),
        ssl_context_factory=None if context is None else (lambda config, default: context),
    )


def _bind(host: str, port: int, backlog: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise RewardError(
            f"serve-rewards: cannot bind {host}:{port} ({exc}): choose another --port or --host"
        ) from None
    sock.listen(backlog)
    return sock


def serve(
    runner: RewardRunner,
    host: str = "127.0.0.1",
    port: int = 0,
    token: str | None = None,
    options: ServeOptions | None = None,
) -> RewardServer:
    """A started server (its event loop on a background thread) scoring with ``runner``; :func:`stop` stops it."""
    from grpokit.rewards.serve_app import RewardApp

    options = options or ServeOptions()
    options.check()
    check_binding(host, token)
    context = options.tls_context()
    service = RewardService(runner, options.max_queue)
    app = RewardApp(service, token, options.max_body, options.request_timeout)
    config = _config(app, service, options, context)
    server = RewardServer(service, _bind(host, port, config.backlog), config)
    server.thread.start()  # the socket listens already: a connection made now waits in the backlog
    return server


def raise_open_files(wanted: int) -> None:
    """Raise this process' soft limit of open files toward ``wanted`` (as far as the hard limit allows)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    goal = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < goal:
        resource.setrlimit(resource.RLIMIT_NOFILE, (goal, hard))


def run_server(
    runner: RewardRunner, host: str, port: int, token: str | None, options: ServeOptions | None = None
) -> int:
    """``grpokit serve-rewards``' server over ``runner`` (built by
    :func:`grpokit.compose.rewards.served_reward_runner`): announces itself, serves until a signal ends the
    command, then stops and closes the runner."""
    server = None
    options = options or ServeOptions()
    try:
        raise_open_files(options.max_connections + 256)  # the runner's workers and files besides the connections
        server = serve(runner, host, port, token, options)
        host, port = server.server_address[:2]
        scheme = "https" if options.certfile else "http"
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
