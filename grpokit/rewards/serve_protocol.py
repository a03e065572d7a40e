"""``grpokit serve-rewards``' HTTP/1.1 connections: uvicorn's h11 protocol with the limits plain uvicorn lacks.

- **Header time**: a connection has ``header_timeout`` seconds from its opening (or from the first byte of a
  kept-alive connection's next request) to send a whole request line and headers. A client that sends nothing, or
  half a request, and waits is closed then (with a JSON 408 when it sent a part). uvicorn's own
  ``timeout_keep_alive`` covers only an idle kept-alive connection, which is ``keep_alive_timeout`` here.
- **Malformed requests** (a bad request line or header, a bad Content-Length, headers over the bound) get a JSON
  ``{"error": reason}`` with h11's status (400, 431, ...), not uvicorn's plain text.
- **Connections**: one over ``max_connections`` is answered 503 (JSON, ``Retry-After: 1``) and closed at once.
- **Half-close**: a client that shuts its sending side (EOF) after a request, or in the middle of its body, still
  gets its answer (the body, short of its Content-Length, is a 400 in :mod:`grpokit.rewards.serve_app`), then the
  connection closes.

Everything runs on the server's one event loop; no thread per connection.
"""

from __future__ import annotations

import json
import sys
from typing import ClassVar

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from grpokit.rewards.serve_settings import MAX_HEADER_BYTES

PHRASES = {400: "Bad Request", 408: "Request Timeout", 431: "Request Header Fields Too Large", 503: "Unavailable"}


def raw_answer(status: int, reason: str, extra: str = "") -> bytes:
    """A whole HTTP/1.1 answer that closes the connection: for the moments no request is parsed to answer through."""
    body = json.dumps({"error": reason}).encode()
    head = (
        f"HTTP/1.1 {status} {PHRASES.get(status, 'Error')}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n{extra}Connection: close\r\n\r\n"
    )
    return head.encode("latin-1") + body


def protocol_error(exc: BaseException | None) -> tuple[int, str]:
    """The status and reason of h11's refusal of a request (its error_status_hint, 400 when not a client error)."""
    text = str(exc) if exc is not None else "invalid HTTP request"
    hint = getattr(exc, "error_status_hint", 400)
    status = hint if 400 <= hint < 500 else 400
    if "Content-Length" in text:
        return 400, f"Content-Length must be one number of bytes ({text})"
    if status == 431:
        return 431, f"Line too long: the request line and headers are over {MAX_HEADER_BYTES} bytes ({text})"
    if hint == 501:
        return 400, f"Bad request: {text} (send the body with a Content-Length)"
    return status, f"Bad request: {text}"


class BoundedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a header timeout, JSON refusals, a connection bound and half-close answers
    (module docstring). :func:`grpokit.rewards.serve.serve` makes a subclass with the three class settings."""

    header_timeout: ClassVar[float] = 10.0
    max_connections: ClassVar[int] = 4096
    on_refused: ClassVar[object] = None  # called with the status of each refusal made here (the metrics)
    _header_timer = None

    def connection_made(self, transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.max_connections:
            self._refuse(503, f"over this server's --max-connections ({self.max_connections})", "Retry-After: 1\r\n")
            return
        self._arm_header_timer()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._watch_headers()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._watch_headers()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_header_timer()
        super().connection_lost(exc)

    def eof_received(self) -> bool | None:
        """The client shut its sending side: answer a request in progress (a body cut short ends here), then close;
        with none in progress, close now."""
        cycle = self.cycle
        if cycle is None or cycle.response_complete:
            return None
        cycle.keep_alive = False
        if cycle.more_body:
            cycle.more_body = False
            cycle.message_event.set()
        return True  # keep the sending side open for the answer

    def send_400_response(self, msg: str) -> None:
        """uvicorn calls this inside its ``except h11.RemoteProtocolError``: the error is the one being handled."""
        status, reason = protocol_error(sys.exc_info()[1])
        self._refuse(status, reason)

    def shutdown(self) -> None:
        try:
            super().shutdown()
        except h11.LocalProtocolError:  # a connection h11 has given up on: nothing to say, close it
            self.transport.close()

    def _refuse(self, status: int, reason: str, extra: str = "") -> None:
        self._disarm_header_timer()
        if callable(self.on_refused):
            self.on_refused(status)
        if not self.transport.is_closing():
            self.transport.write(raw_answer(status, reason, extra))
            self.transport.close()

    def _awaiting_headers(self) -> bool:
        return self.conn.their_state is h11.IDLE and not self.transport.is_closing()

    def _watch_headers(self) -> None:
        """Arm the header timer when part of a request is buffered and not yet a request; disarm it once parsed."""
        if not self._awaiting_headers():
            self._disarm_header_timer()
        elif self.conn.trailing_data[0] and self._header_timer is None:
            self._arm_header_timer()

    def _arm_header_timer(self) -> None:
        self._header_timer = self.loop.call_later(self.header_timeout, self._headers_late)

    def _disarm_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _headers_late(self) -> None:
        self._header_timer = None
        if not self._awaiting_headers():
            return
        if self.conn.trailing_data[0]:
            self._refuse(408, f"the request line and headers were not sent within {self.header_timeout:g} s")
        else:  # nothing sent: nothing to answer
            self._unset_keepalive_if_required()
            self.transport.close()
