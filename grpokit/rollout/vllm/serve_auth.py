"""Run inside a ``vllm serve`` started by ``grpokit vllm-serve`` (vLLM's ``--middleware`` hook, which adds a class
with ``app.add_middleware``: the outermost layer, before any route): the server's key on every route.

vLLM's own ``--api-key`` (``AuthenticationMiddleware``) guards only ``/v1``, ``/v2``, ``/inference`` and
``/cohere``; the dev-mode routes that push weights and run worker methods (``/collective_rpc``,
``/init_weight_transfer_engine``, ``/update_weights``, ...), ``/server_info``, ``/metrics`` and the rest answer
anyone. :class:`KeyedRoutes` answers HTTP 401 to any HTTP or WebSocket request without ``Authorization: Bearer
KEY``, whatever its path or method, but ``GET``/``HEAD /health`` (liveness: no data, no effect; what load balancers
and the trainer's start-up poll ask). The key is ``VLLM_API_KEY`` of the server's environment (set by
``grpokit vllm-serve``); without one the server does not start. Pure ASGI: no import of vLLM or Starlette."""

from __future__ import annotations

import hashlib
import json
import os
import secrets

OPEN = frozenset({("GET", "/health"), ("HEAD", "/health")})


def bearer(headers: list[tuple[bytes, bytes]]) -> str | None:
    """The token of an ``Authorization: Bearer TOKEN`` header among ASGI ``headers``; None without one."""
    for name, value in headers:
        if name.lower() == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            return token.strip() if scheme.lower() == "bearer" else None
    return None


class KeyedRoutes:
    """ASGI middleware: 401 without the key (module docstring)."""

    def __init__(self, app, key: str | None = None):
        key = key if key is not None else os.environ.get("VLLM_API_KEY")
        if not key:
            raise RuntimeError(
                "grpokit's KeyedRoutes middleware needs the server's key in VLLM_API_KEY; start the server with "
                "`grpokit vllm-serve`, which sets it."
            )
        self.app = app
        self._digest = hashlib.sha256(key.encode()).digest()

    def allowed(self, scope) -> bool:
        root = scope.get("root_path", "")
        path = scope.get("path", "").removeprefix(root) if root else scope.get("path", "")
        if scope["type"] == "http" and (scope.get("method", ""), path) in OPEN:
            return True
        token = bearer(scope.get("headers") or [])
        return token is not None and secrets.compare_digest(hashlib.sha256(token.encode()).digest(), self._digest)

    async def __call__(self, scope, receive, send):
        if scope["type"] not in ("http", "websocket") or self.allowed(scope):
            return await self.app(scope, receive, send)
        if scope["type"] == "websocket":
            return await send({"type": "websocket.close", "code": 1008})  # policy violation, before accepting
        body = json.dumps({"error": "Unauthorized: send the server's key as Authorization: Bearer KEY"}).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                   (b"www-authenticate", b"Bearer")]  # fmt: skip
        await send({"type": "http.response.start", "status": 401, "headers": headers})
        await send({"type": "http.response.body", "body": body})
