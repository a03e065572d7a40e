"""The remote reward against hostile servers, each written here on raw loopback sockets: one that drips its answer a
byte a second, a 1 GB answer (with a length, chunked, and until the socket closes), a gzip bomb, a redirect to another
server, answers that are not UTF-8 or not JSON, and rewards that are NaN, infinity or strings.

Each is scored by a RewardRunner, as in a run, and each must end with an error per completion written by the client
itself (not the runner's reward_timeout, set far above: that the client's own error comes back proves the client
bounded the exchange), within a small memory bound (sampled while the call runs), and with the server's stream
stopped by the client (counted in bytes, not timed). Nothing here sleeps to order events; the drip's one second per
byte is the hostile server's pace, and the one timeout that must exist is the client's own.
"""

from __future__ import annotations

import os
import socket
import threading
import zlib

import pytest

from grpokit.rewards import RewardRunner

REWARD_TIMEOUT = 120.0  # the runner's bound, far above every client timeout here: it must never be what ends a call
GiB = 1 << 30
MiB = 1 << 20


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class PeakRSS:
    """The highest resident memory of this process, sampled every few milliseconds while the block runs."""

    def __enter__(self):
        self.start = self.peak = rss()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self):
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, rss())

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss())

    @property
    def growth(self) -> int:
        return self.peak - self.start


class RawServer:
    """A loopback TCP server: each connection's request is read whole, then ``answer(conn)`` writes what it likes.
    ``sent`` counts the bytes written, ``ended`` is set when an answer ends (finished, or the client hung up)."""

    def __init__(self, answer):
        self.answer, self.sent, self.requests, self.bodies = answer, 0, 0, []
        self.ended, self.broken = threading.Event(), threading.Event()
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/score"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:  # closed
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn):
        with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                data += conn.recv(65536)
            head, body = data.split(b"\r\n\r\n", 1)
            length = next(int(h.split(b":")[1]) for h in head.split(b"\r\n") if h.lower().startswith(b"content-length"))
            while len(body) < length:
                body += conn.recv(65536)
            self.requests += 1
            self.bodies.append(body)
            try:
                self.answer(self, conn)
            except OSError:  # the client shut the connection: what a capped or timed-out read must do
                self.broken.set()
            finally:
                self.ended.set()

    def send(self, conn, data: bytes) -> None:
        conn.sendall(data)
        self.sent += len(data)

    def close(self):
        self.sock.close()


@pytest.fixture
def serve():
    servers = []

    def start(answer):
        servers.append(RawServer(answer))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


def score(url: str, n: int = 2, **spec):
    spec = {"url": url, "retries": 0, "backoff": 0, **spec}
    with RewardRunner([spec], timeout=REWARD_TIMEOUT) as runner:
        # what a run stores with its rollouts (score() would also stop a first batch that failed everywhere)
        result = runner.combine(runner.score_values([f"p{i}" for i in range(n)], [f"c{i}" for i in range(n)]))
    return result.per_func[:, 0].tolist(), result.errors


def assert_all_failed(values, errors, message: str):
    assert all(v != v for v in values), values  # NaN: no value for any completion
    assert len(errors) == len(values) and all(e is not None and message in e for e in errors), errors
    assert not any(f"after {REWARD_TIMEOUT:g} s" in e for e in errors)  # the client ended it, not the runner


def test_an_answer_dripped_a_byte_a_second_is_cut_at_the_requests_timeout(serve):
    answer = b'HTTP/1.1 200 OK\r\nContent-Length: 27\r\n\r\n{"rewards": [1.0, 1.0]}    '

    def drip(server, conn):
        for byte in answer:
            server.send(conn, bytes([byte]))
            threading.Event().wait(1.0)  # the hostile server's pace: a byte a second

    server = serve(drip)
    values, errors = score(server.url, timeout=2)
    assert_all_failed(values, errors, "timed out after 2 s")
    assert server.ended.wait(30)  # generous: the drip's next byte after the client hung up fails at once
    assert server.broken.is_set() and server.sent < len(answer)  # the connection was dropped mid-answer


def _zeros_forever(head: bytes, chunked: bool):
    def answer(server, conn):
        server.send(conn, head)
        block = bytes(64 << 10)
        frame = b"%x\r\n%s\r\n" % (len(block), block) if chunked else block
        while server.sent < GiB:
            server.send(conn, frame)

    return answer


@pytest.mark.parametrize(
    ("head", "chunked"),
    [
        (b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % GiB, False),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", True),
        (b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n", False),  # no length: read until the socket closes
    ],
    ids=["content-length", "chunked", "until-close"],
)
def test_a_1gb_answer_is_capped_with_an_error_per_completion(serve, head, chunked):
    server = serve(_zeros_forever(head, chunked))
    with PeakRSS() as memory:
        values, errors = score(server.url, n=3, max_answer_bytes=4 * MiB)
    assert_all_failed(values, errors, "over max_answer_bytes (4194304")
    assert server.ended.wait(60) and server.broken.is_set()  # generous: the client hung up, the stream failed
    assert server.sent < 64 * MiB  # the cap plus socket buffers: never the gigabyte
    assert memory.growth < 100 * MiB, memory.growth


@pytest.fixture(scope="module")
def gzip_bomb() -> bytes:
    """1 GiB of zeros gzipped (about 1 MB): built a block at a time, never held inflated."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    block = bytes(MiB)
    return b"".join(packer.compress(block) for _ in range(1024)) + packer.flush()


def test_a_gzip_bomb_is_inflated_only_up_to_the_cap(serve, gzip_bomb):
    def bomb(server, conn):
        head = b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: %d\r\n\r\n" % len(gzip_bomb)
        server.send(conn, head + gzip_bomb)

    server = serve(bomb)
    with PeakRSS() as memory:
        values, errors = score(server.url, max_answer_bytes=4 * MiB)
    assert_all_failed(values, errors, "over max_answer_bytes (4194304 bytes inflated)")
    assert memory.growth < 100 * MiB, memory.growth


def test_a_redirect_to_another_server_is_not_followed(serve):
    target = serve(lambda server, conn: server.send(conn, b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}"))
    other = target.url.replace("127.0.0.1", "localhost")  # another host name, another port
    redirect = b"HTTP/1.1 302 Found\r\nLocation: %s\r\nContent-Length: 0\r\n\r\n" % other.encode()
    server = serve(lambda s, conn: s.send(conn, redirect))
    values, errors = score(server.url)
    assert_all_failed(values, errors, f"HTTP 302: a redirect to {other} (not followed)")
    assert target.requests == 0


def _answer(body: bytes, *headers: bytes):
    def answer(server, conn):
        head = b"HTTP/1.1 200 OK\r\n" + b"".join(h + b"\r\n" for h in headers)
        server.send(conn, head + b"Content-Length: %d\r\n\r\n" % len(body) + body)

    return answer


@pytest.mark.parametrize(
    ("body", "headers", "message"),
    [
        (b'{"rewards": ["\xff\xfe", 1.0]}', (), "the answer is not UTF-8 (invalid start byte at byte 14)"),
        (b'{"rewards": [1.0, ', (), "the answer is not JSON"),
        (b"<html>oops</html>", (), "the answer is not JSON"),
        (b"[" * 100_000 + b"]" * 100_000, (), "the answer is JSON nested too deep to read"),
        (b'{"rewards": 1.0}', (), "the answer has no 'rewards' list"),
        (b'{"rewards": [1.0]}', (), "the answer has 1 rewards for 2 completions"),
        (zlib.compress(b'{"rewards": [1.0, 1.0]}')[:-3] + b"xyz", (b"Content-Encoding: gzip",), "data is corrupt"),
        (b'{"rewards": [1.0, 1.0]}', (b"Content-Encoding: br",), "Content-Encoding 'br' is not gzip or deflate"),
    ],
    ids=["not-utf8", "cut-json", "html", "deep", "rewards-not-list", "wrong-count", "corrupt-gzip", "brotli"],
)
def test_an_answer_that_is_not_what_the_format_promises_gives_errors(serve, body, headers, message):
    server = serve(_answer(body, *headers))
    values, errors = score(server.url)
    assert_all_failed(values, errors, message)


def test_nan_infinity_and_strings_as_rewards_give_an_error_each_and_keep_the_good_values(serve):
    server = serve(_answer(b'{"rewards": [NaN, Infinity, -Infinity, "0.5", true, {"a": 1}, 0.25, null]}'))
    values, errors = score(server.url, n=8)
    assert values[6] == 0.25 and all(v != v for i, v in enumerate(values) if i != 6)
    assert [e and e.removeprefix("remote: ") for e in errors] == [
        "the server answered nan where a finite number was expected",
        "the server answered inf where a finite number was expected",
        "the server answered -inf where a finite number was expected",
        "the server answered '0.5' where a number was expected",
        "the server answered 'True' where a number was expected",
        "the server answered \"{'a': 1}\" where a number was expected",
        None,
        None,  # null: "does not apply", no error
    ]


def test_retry_after_of_a_full_server_is_honoured(serve):
    """A 503 with Retry-After: 1 is retried after at least that second (backoff 0 would retry at once)."""
    import time

    arrivals = []

    def busy_then_ok(server, conn):
        arrivals.append(time.monotonic())
        if len(arrivals) == 1:
            body = b'{"error": "queue full"}'
            head = b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nContent-Length: %d\r\n\r\n" % len(body)
            server.send(conn, head + body)
        else:
            _answer(b'{"rewards": [1.0, 0.0]}')(server, conn)

    server = serve(busy_then_ok)
    values, errors = score(server.url, retries=1)
    assert values == [1.0, 0.0] and errors == [None, None]
    assert len(arrivals) == 2 and arrivals[1] - arrivals[0] >= 1.0  # a lower bound: sleeping never ends early


def test_nan_in_a_column_is_sent_as_null_not_refused(serve):
    """JSON has no NaN (a dataset's missing value): it goes as null, and the request is sent."""
    import json

    server = serve(_answer(b'{"rewards": [1.0, 0.0]}'))
    with RewardRunner([{"url": server.url, "retries": 0}], timeout=REWARD_TIMEOUT) as runner:
        result = runner.combine(runner.score_values(["p", "q"], ["a", "b"], {"answer": [float("nan"), 2.5]}))
    assert result.per_func[:, 0].tolist() == [1.0, 0.0] and result.errors == [None, None]
    assert json.loads(server.bodies[0])["columns"] == {"answer": [None, 2.5]}
