"""``grpokit serve-rewards``' ASGI application: routes, the token, and a scoring request's way through the queue.

A scoring request is checked on its headers first (token, path, method, Content-Length against ``max_body``), then
takes a place in the queue (503 with ``Retry-After`` when full) and only then is its body read (within
``request_timeout``), parsed and checked (on a parse thread, off the event loop) and scored in its turn on the
batch thread (:class:`~grpokit.rewards.serve_queue.TurnQueue`). The routes, statuses and error bodies are
:mod:`grpokit.rewards.serve`'s docstring.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import sys
import traceback
from typing import TYPE_CHECKING, Any

from grpokit.rewards.serve_requests import BadRequest
from grpokit.rewards.serve_settings import MAX_HEADER_BYTES, MAX_HEADERS

if TYPE_CHECKING:
    from grpokit.rewards.serve_service import RewardService

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
TEXT = "text/plain; version=0.0.4; charset=utf-8"


class ClientGone(Exception):
    """The client closed the connection before its answer: nothing to send."""


class Request:
    """One request's scope, read: path, method, headers (lower-case names), whether a body is still unread."""

    def __init__(self, scope: dict[str, Any]):
        self.path = scope["path"].rstrip("/") or "/"
        self.method = scope["method"]
        self.version = scope["http_version"]
        self.raw_headers: list[tuple[bytes, bytes]] = scope["headers"]
        self.headers = {name.decode("latin-1"): value.decode("latin-1") for name, value in self.raw_headers}
        self.route, self.allowed = ROUTES.get(self.path, ("other", None))
        self.unread = self.headers.get("content-length", "0").strip() not in ("", "0") or (
            "transfer-encoding" in self.headers
        )

    def head_bytes(self) -> int:
        return len(self.path) + sum(len(name) + len(value) + 4 for name, value in self.raw_headers)


async def read_body(receive, length: int, timeout: float) -> bytes:
    """The body, all ``length`` bytes of it within ``timeout`` seconds (BadRequest 408 / 400 otherwise)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    chunks: list[bytes] = []
    got = 0
    while True:
        try:
            message = await asyncio.wait_for(receive(), max(0.0, deadline - loop.time()))
        except asyncio.TimeoutError:
            raise BadRequest(408, f"the body was not sent within {timeout:g} s") from None
        if message["type"] == "http.disconnect":
            raise ClientGone
        chunks.append(message.get("body", b""))
        got += len(chunks[-1])
        if not message.get("more_body", False):
            break
    if got < length:
        raise BadRequest(400, f"the body ended after {got} of its {length} bytes")
    return b"".join(chunks)


class RewardApp:
    """The ASGI app of one server: ``service`` scores, ``token`` (or None) is required on every request."""

    def __init__(self, service: RewardService, token: str | None, max_body: int, request_timeout: float):
        self.service = service
        self.token = token
        self.max_body = max_body
        self.request_timeout = request_timeout

    async def __call__(self, scope: dict[str, Any], receive, send) -> None:
        if scope["type"] != "http":  # lifespan is off; websockets are not served
            return
        request = Request(scope)
        try:
            status, body, headers = await self._answer(request, receive)
        except BadRequest as exc:
            status, body, headers = exc.status, {"error": str(exc)}, exc.headers
        except ClientGone:
            return
        except Exception as exc:  # the server's own fault, not the client's: logged with its traceback
            traceback.print_exc(file=sys.stderr)
            status, body, headers = (
                500,
                {"error": f"the reward server failed: {type(exc).__name__}: {str(exc)[:300]}"},
                {},
            )
        await self._send(send, request, status, body, headers)

    async def _send(self, send, request: Request, status: int, body: Any, headers: dict[str, str]) -> None:
        data, kind = (body.encode(), TEXT) if isinstance(body, str) else (json.dumps(body).encode(), "application/json")
        self.service.metrics.answered(request.route, status)
        head = [(b"content-type", kind.encode()), (b"content-length", str(len(data)).encode())]
        head += [(name.lower().encode(), value.encode()) for name, value in headers.items()]
        if request.unread:  # a body announced and not read: the connection closes after the answer
            head.append((b"connection", b"close"))
        await send({"type": "http.response.start", "status": status, "headers": head})
        await send({"type": "http.response.body", "body": data})

    def _check_head(self, request: Request) -> None:
        if request.version not in ("1.0", "1.1"):
            raise BadRequest(400, f"Invalid HTTP version ({request.version}): this server speaks HTTP/1.0 and 1.1")
        if request.head_bytes() > MAX_HEADER_BYTES or len(request.raw_headers) > MAX_HEADERS:
            raise BadRequest(431, f"Line too long or too many headers: over {MAX_HEADER_BYTES} bytes or {MAX_HEADERS}")
        if request.method not in ("GET", "POST"):
            raise BadRequest(405, f"method {request.method!r} is not served: {SERVED}", {"Allow": "GET, POST"})
        if self.token is not None:
            given = request.headers.get("authorization", "")
            if not hmac.compare_digest(given.encode("utf-8", "replace"), f"Bearer {self.token}".encode()):
                raise BadRequest(401, "missing or wrong token (Authorization: Bearer TOKEN)")
        if request.allowed is None:
            raise BadRequest(404, f"no {request.path[:200]}: {SERVED}")
        if request.method != request.allowed:
            raise BadRequest(
                405, f"{request.path} takes {request.allowed}, not {request.method}", {"Allow": request.allowed}
            )

    async def _answer(self, request: Request, receive) -> tuple[int, Any, dict[str, str]]:
        self._check_head(request)
        if request.route == "health":
            return 200, {"status": "ok", "rewards": list(self.service.runner.names)}, {}
        if request.route == "metrics":
            return 200, self.service.metrics.render(self.service.queue), {}
        if "transfer-encoding" in request.headers:
            raise BadRequest(411, "send the body with a Content-Length (chunked bodies are not read)")
        length = int(request.headers.get("content-length", "0") or 0)  # h11 checked it is one number
        if length > self.max_body:
            raise BadRequest(413, f"the body has {length} bytes, over this server's --max-body ({self.max_body})")
        return 200, await self.service.answer(request.route, lambda: self._body(request, receive, length)), {}

    async def _body(self, request: Request, receive, length: int) -> bytes:
        data = await read_body(receive, length, self.request_timeout)
        request.unread = False
        return data
