"""One bounded HTTP exchange of the remote reward (:mod:`grpokit.rewards.remote`): POST a JSON body, read a JSON answer.

A reward server is trusted with nothing:

- ``timeout`` bounds the whole exchange, not each read: a watchdog shuts the request's socket down at the deadline,
  so a server that drips its answer a byte at a time, or stalls after its headers, ends there;
- the answer is streamed and read up to ``max_bytes``, counted before and after inflating (gzip and deflate are
  inflated here, ``max_bytes + 1`` bytes at most per step, so a gzip bomb costs ``max_bytes`` of memory, not its
  inflated size); a ``Content-Length`` over the cap fails before reading;
- redirects are not followed (a 3xx is a failure naming where it pointed);
- the answer must be UTF-8 JSON (any nesting the parser allows; deeper is an error, not a crash).

Every failure is a :class:`RequestFailed` with a one-line message, ``retry`` when another try may succeed (a
connection error, a timeout, HTTP 408, 429 or 5xx) and ``retry_after`` when a 429 or 503 said when.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import zlib
from email.utils import parsedate_to_datetime
from typing import Any

RETRY_STATUS = {408, 429, 500, 502, 503, 504}
ENCODINGS = ("gzip", "x-gzip", "deflate")  # inflated here with zlib; the only ones asked for (Accept-Encoding)
ACCEPT_ENCODING = "gzip, deflate"


class RequestFailed(Exception):
    """One request's failure, as the stored error says it; ``retry`` when another try may succeed."""

    def __init__(self, message: str, retry: bool, retry_after: float | None = None):
        super().__init__(message)
        self.retry = retry
        self.retry_after = retry_after


class Watchdog:
    """Shuts a request's socket down ``seconds`` after it starts, unless :meth:`done` came first. httpcore's trace
    hook (``extensions={"trace": watchdog.trace}``) hands it each new connection's stream (the TLS one after the
    handshake); a read blocked on the socket then returns at once, and the request fails."""

    def __init__(self, seconds: float):
        self.fired = False
        self._stream: Any = None
        self._finished = False
        self._lock = threading.Lock()
        self._timer = threading.Timer(seconds, self._fire)
        self._timer.daemon = True
        self._timer.start()

    def trace(self, event: str, info: dict) -> None:
        if event in ("connection.connect_tcp.complete", "connection.start_tls.complete"):
            self._stream = info.get("return_value")

    def _fire(self) -> None:
        with self._lock:
            if self._finished:
                return
            self.fired = True
            sock = None if self._stream is None else self._stream.get_extra_info("socket")
            if sock is not None:
                # socket.socket's own shutdown: an SSLSocket's would drop its SSL object under the reader
                with contextlib.suppress(OSError):  # already closed
                    socket.socket.shutdown(sock, socket.SHUT_RDWR)

    def done(self) -> None:
        with self._lock:
            self._finished = True
        self._timer.cancel()
        self._timer.join()  # cancelled, it ends at once: no timer thread outlives its request


def read_capped(response: Any, max_bytes: int) -> bytes:
    """The body of an httpx streaming ``response``, inflated, at most ``max_bytes``; RequestFailed past that."""
    length = response.headers.get("content-length", "")
    if length.strip().isdigit() and int(length) > max_bytes:
        raise RequestFailed(f"the answer is {int(length)} bytes, over max_answer_bytes ({max_bytes}): not read", False)
    encoding = response.headers.get("content-encoding", "identity").strip().lower()
    if encoding not in ("", "identity", *ENCODINGS):
        raise RequestFailed(f"the answer's Content-Encoding {encoding!r} is not gzip or deflate", retry=False)
    decoder = None if encoding in ("", "identity") else zlib.decompressobj(32 + zlib.MAX_WBITS)  # gzip or zlib
    out, received = bytearray(), 0
    over = f"the answer is over max_answer_bytes ({max_bytes} bytes{' inflated' if decoder else ''}): not read further"
    for chunk in response.iter_raw():
        received += len(chunk)
        if received > max_bytes:
            raise RequestFailed(over, retry=False)
        while chunk:
            if decoder is None:
                piece, chunk = chunk, b""
            else:
                try:
                    piece = decoder.decompress(chunk, max_bytes + 1 - len(out))
                except zlib.error as exc:
                    raise RequestFailed(f"the answer's {encoding} data is corrupt ({exc})", retry=False) from None
                chunk = decoder.unconsumed_tail
            out += piece
            if len(out) > max_bytes:
                raise RequestFailed(over, retry=False)
    return bytes(out)


def parse_json(data: bytes) -> Any:
    """UTF-8 JSON ``data`` as a value (NaN and Infinity included: the caller judges the values)."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RequestFailed(f"the answer is not UTF-8 ({exc.reason} at byte {exc.start})", retry=False) from None
    try:
        return json.loads(text)
    except RecursionError:
        raise RequestFailed("the answer is JSON nested too deep to read", retry=False) from None
    except ValueError:
        raise RequestFailed(f"the answer is not JSON: {text[:200]!r}", retry=False) from None


def retry_after(value: str | None) -> float | None:
    """Seconds from a ``Retry-After`` header (a number of seconds, or an HTTP date); None when absent or unreadable."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        from datetime import datetime, timezone

        return max(0.0, (parsedate_to_datetime(value) - datetime.now(timezone.utc)).total_seconds())
    except (TypeError, ValueError):
        return None


def status_failure(response: Any) -> RequestFailed:
    """The failure of a non-200 answer: its status and up to 200 characters of its body (read capped)."""
    status = response.status_code
    if 300 <= status < 400:
        where = response.headers.get("location", "nowhere")
        return RequestFailed(f"HTTP {status}: a redirect to {where[:200]} (not followed)", retry=False)
    try:
        text = read_capped(response, 4096).decode("utf-8", "replace")[:200]
    except RequestFailed as exc:
        text = f"({exc})"
    wait = retry_after(response.headers.get("retry-after")) if status in (429, 503) else None
    return RequestFailed(f"HTTP {status}: {text}", retry=status in RETRY_STATUS, retry_after=wait)


def post_json(client: Any, url: str, body: Any, timeout: float, max_bytes: int) -> Any:
    """POST ``body`` as JSON to ``url`` with the httpx ``client``; the answer's JSON value, the whole exchange within
    ``timeout`` seconds and ``max_bytes`` (module docstring); RequestFailed otherwise."""
    import httpx

    watchdog = Watchdog(timeout)
    try:
        with client.stream("POST", url, json=body, extensions={"trace": watchdog.trace}) as response:
            if response.status_code != 200:
                raise status_failure(response)
            data = read_capped(response, max_bytes)
        if watchdog.fired:  # an answer without a length ends where the socket was shut: cut short, not complete
            raise httpx.ReadError("cut at the deadline")
    except httpx.TimeoutException as exc:
        raise RequestFailed(f"timed out after {timeout:g} s ({type(exc).__name__})", retry=True) from None
    except (httpx.HTTPError, OSError) as exc:
        if watchdog.fired:
            raise RequestFailed(f"timed out after {timeout:g} s (the answer was not complete)", retry=True) from None
        raise RequestFailed(f"{type(exc).__name__}: {exc}", retry=True) from None
    finally:
        watchdog.done()
    return parse_json(data)
