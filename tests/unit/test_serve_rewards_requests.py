"""`grpokit serve-rewards` answers every malformed request with a 4xx and a JSON reason (never a 5xx, a dropped
connection or a traceback in its log), then still scores a valid request; and a hypothesis fuzz test of every
endpoint with random JSON values and random bytes. The server runs in this process on a loopback port, its reward on
a thread; requests are raw bytes on a socket, so that nothing a client library would tidy up is tidied up."""

from __future__ import annotations

import json
import socket

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from grpokit.rewards import RewardRunner
from grpokit.rewards.contract import text_of
from grpokit.rewards.serve import ServeOptions, serve, stop

MAX_BODY = 1 << 20


def words(completions, **kwargs):
    return [float(len(text_of(c).split())) for c in completions]


@pytest.fixture(scope="module")
def server():
    runner = RewardRunner([words], isolate=False)
    server = serve(runner, options=ServeOptions(max_body=MAX_BODY, request_timeout=2.0, header_timeout=2.0))
    yield server.server_address[1]
    stop(server)
    runner.close()


def exchange(port: int, raw: bytes, half_close: bool = False) -> tuple[int, dict[str, str], bytes]:
    """Send ``raw``, read one answer: (status, headers, body). The read's timeout is generous: the server answers
    at once, or after its 2 s request or header timeout in the cases that test them."""
    with socket.create_connection(("127.0.0.1", port), timeout=60) as conn:
        conn.sendall(raw)
        if half_close:
            conn.shutdown(socket.SHUT_WR)
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = conn.recv(65536)
            assert chunk, f"the connection closed without an answer after {data!r}"
            data += chunk
        head, body = data.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers = {k.lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
        while len(body) < int(headers["content-length"]):
            chunk = conn.recv(65536)
            assert chunk, "the connection closed mid-answer"
            body += chunk
    return status, headers, body


def post(path: str, body: bytes, *headers: str) -> bytes:
    head = "".join(h + "\r\n" for h in headers)
    return f"POST {path} HTTP/1.1\r\nHost: x\r\n{head}Content-Length: {len(body)}\r\n\r\n".encode() + body


def score_json(value) -> bytes:
    return post("/score", json.dumps(value).encode())


VALID = {"prompts": ["p", "q"], "completions": ["one two", "three"], "columns": {"answer": ["1", "2"]}}
DEEP = {"prompts": ["p"], "completions": ["c"], "columns": {"answer": [json.loads("[" * 40 + "]" * 40)]}}

MALFORMED = {
    "bad-json": (post("/score", b'{"prompts": ['), 400, "the body is not JSON"),
    "nesting-100k": (post("/score", b"[" * 100_000 + b"]" * 100_000), 400, "deeper than 32 levels"),
    "nesting-40-in-a-column": (score_json(DEEP), 400, "deeper than 32 levels"),
    "columns-a-list": (
        score_json({"prompts": ["a"], "completions": ["5"], "columns": [1]}),
        400,
        "'columns' must be an object",
    ),
    "completions-a-string": (score_json({"completions": "5"}), 400, "'completions' must be a list, got a string"),
    "completion-a-number": (score_json({"completions": ["a", 5]}), 400, "'completions'[1] must be a string"),
    "message-without-role": (score_json({"completions": [[{"content": "x"}]]}), 400, "'completions'[0] must be"),
    "prompts-wrong-length": (score_json({"prompts": ["p"], "completions": ["a", "b"]}), 400, "'prompts' has 1 values"),
    "column-wrong-length": (
        score_json({"completions": ["a", "b"], "columns": {"answer": ["1"]}}),
        400,
        "'columns.answer' has 1 values for 2",
    ),
    "column-not-a-list": (
        score_json({"completions": ["a"], "columns": {"answer": "1"}}),
        400,
        "'columns.answer' must be a list",
    ),
    "reserved-column": (
        score_json({"completions": ["a"], "columns": {"trainer_state": [1]}}),
        400,
        "'trainer_state' is a keyword",
    ),
    "completion-ids-not-ints": (
        score_json({"completions": ["a"], "columns": {"completion_ids": [[1, "2"]]}}),
        400,
        "'columns.completion_ids' must hold a list of token ids",
    ),
    "missing-completions": (score_json({"prompts": ["a"]}), 400, "no 'completions'"),
    "unknown-key": (score_json({"completions": ["a"], "completion": ["a"]}), 400, "unknown key 'completion'"),
    "body-a-list": (score_json(["a"]), 400, "a grpokit request is an object"),
    "not-utf8": (post("/score", b'{"completions": ["\xff"]}'), 400, "the body is not UTF-8"),
    "nan": (post("/score", b'{"completions": ["a"], "columns": {"x": [NaN]}}'), 400, "NaN is not a JSON value"),
    "empty-body": (post("/score", b""), 400, "the body is empty"),
    "over-max-body": (
        b"POST /score HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % (MAX_BODY + 1),  # the body is never sent
        413,
        "over this server's --max-body (1048576)",
    ),
    "chunked": (
        b"POST /score HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
        411,
        "chunked",
    ),
    "bad-content-length": (
        b"POST /score HTTP/1.1\r\nHost: x\r\nContent-Length: ten\r\n\r\n",
        400,
        "Content-Length must be",
    ),
    "body-shorter-than-length": (
        b"POST /score HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n{}",
        400,
        "ended after 2 of",
    ),
    "body-never-sent": (b"POST /score HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n", 408, "not sent within 2 s"),
    "unknown-path": (post("/nope", b"{}"), 404, "no /nope"),
    "put": (b"PUT /score HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n", 405, "method 'PUT' is not served"),
    "made-up-method": (b"FROB /score HTTP/1.1\r\nHost: x\r\n\r\n", 405, "method 'FROB' is not served"),
    "get-on-score": (b"GET /score HTTP/1.1\r\nHost: x\r\n\r\n", 405, "/score takes POST, not GET"),
    "post-on-health": (post("/health", b"{}"), 405, "/health takes GET, not POST"),
    "no-host-header": (b"GET /health HTTP/1.1\r\n\r\n", 400, "Missing mandatory Host: header"),
    "request-line-never-finished": (b"POST /score HT", 408, "request line and headers were not sent within 2 s"),
    "headers-never-finished": (b"GET /health HTTP/1.1\r\nHost: x\r\nX-", 408, "not sent within 2 s"),
    "garbage-request-line": (b"\x00\x01garbage\r\n\r\n", 400, "Bad request"),
    "http-2-request-line": (b"GET /health HTTP/2.0\r\n\r\n", 400, "Invalid HTTP version"),
    "header-line-too-long": (
        b"GET /health HTTP/1.1\r\nHost: x\r\nX: " + b"a" * 70_000 + b"\r\n\r\n",
        431,
        "Line too long",
    ),
    "openrlhf-query-not-a-list": (post("/openrlhf", b'{"query": "a"}'), 400, "'query' must be a list of strings"),
    "openrlhf-labels-wrong-length": (
        post("/openrlhf", b'{"query": ["a", "b"], "labels": ["1"]}'),
        400,
        "'labels' has 1 values for 2",
    ),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_every_malformed_request_gets_a_4xx_with_a_json_reason(server, case, capfd):
    raw, status, reason = MALFORMED[case]
    got, headers, body = exchange(server, raw, half_close=case == "body-shorter-than-length")
    assert got == status and 400 <= got < 500
    assert headers["content-type"] == "application/json"
    assert reason in json.loads(body)["error"]
    if case in ("put", "made-up-method"):
        assert headers["allow"] == "GET, POST"
    # and the server still scores a valid request, with nothing in its log
    assert exchange(server, score_json(VALID))[0] == 200
    assert "Traceback" not in capfd.readouterr().err


def test_a_valid_request_is_scored_and_the_metrics_count_it(server):
    status, _, body = exchange(server, score_json(VALID))
    assert status == 200 and json.loads(body)["rewards"] == [2.0, 1.0]
    status, _, body = exchange(server, post("/openrlhf", b'{"query": ["Q a b"], "prompts": ["Q "], "labels": ["x"]}'))
    assert status == 200 and json.loads(body)["rewards"] == [2.0]
    assert (
        exchange(server, score_json({"completions": []}))[2]
        == json.dumps({"rewards": [], "errors": [], "extra": {}, "metrics": {}, "per_reward": {}}).encode()
    )
    status, headers, body = exchange(server, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
    text = body.decode()
    assert status == 200 and headers["content-type"].startswith("text/plain; version=0.0.4")
    samples = dict(line.rsplit(" ", 1) for line in text.splitlines() if not line.startswith("#"))
    assert int(samples['grpokit_reward_requests_total{route="openrlhf",code="200"}']) >= 1
    assert int(samples["grpokit_reward_completions_total"]) >= 3
    assert samples["grpokit_reward_queue_waiting"] == "0" and samples["grpokit_reward_queue_scoring"] == "0"
    count = int(samples["grpokit_reward_latency_seconds_count"])
    assert int(samples['grpokit_reward_latency_seconds_bucket{le="+Inf"}']) == count >= 2


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)
# near-valid requests: the right keys with random values, so the checks below the top level are reached
near_valid = st.fixed_dictionaries(
    {},
    optional={
        "prompts": json_values | st.lists(st.text(), max_size=3),
        "completions": json_values | st.lists(st.text() | json_values, max_size=3),
        "columns": json_values | st.dictionaries(st.text(max_size=5), json_values, max_size=2),
        "query": json_values | st.lists(st.text(), max_size=3),
        "labels": json_values,
    },
)
PATHS = ["/score", "/", "/openrlhf", "/get_reward", "/health", "/metrics", "/other"]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    path=st.sampled_from(PATHS),
    body=st.one_of(
        json_values.map(lambda v: json.dumps(v).encode()),
        near_valid.map(lambda v: json.dumps(v).encode()),
        st.binary(max_size=200),
    ),
)
def test_fuzz_every_endpoint_answers_2xx_or_4xx_and_keeps_serving(server, path, body, capfd):
    status, _, answer = exchange(server, post(path, body))
    assert 200 <= status < 300 or 400 <= status < 500, (status, answer)
    if status >= 400:
        assert json.loads(answer)["error"]
    assert exchange(server, score_json(VALID))[0] == 200
    assert "Traceback" not in capfd.readouterr().err


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    start=st.sampled_from(
        [
            b"",
            b"GET /health HTTP/1.1\r\nHost: x\r\n",
            b"POST /score HTTP/1.1\r\nHost: x\r\n",
            b"POST /openrlhf HTTP/1.0\r\n",
        ]
    ),
    raw=st.binary(max_size=300),
)
def test_fuzz_random_bytes_as_a_whole_request_get_an_answer(server, start, raw, capfd):
    """Random bytes (after a request line, or none), ended as a request's headers end and then by the client's
    half-close: an answer with a 2xx or 4xx status, or none where the bytes held no request line; never a 5xx."""
    raw = start + raw + b"\r\n\r\n"
    with socket.create_connection(("127.0.0.1", server), timeout=60) as conn:
        conn.sendall(raw)
        conn.shutdown(socket.SHUT_WR)
        data = b""
        while chunk := conn.recv(65536):
            data += chunk
    if data:
        status = int(data.split(b" ", 2)[1])
        assert 200 <= status < 300 or 400 <= status < 500, data[:300]
    assert exchange(server, score_json(VALID))[0] == 200
    assert "Traceback" not in capfd.readouterr().err


class Gate:
    """A reward that records each batch's first completion and holds every batch until ``release`` is set."""

    def __init__(self):
        import threading

        self.release = threading.Event()
        self.order: list[str] = []

    def __call__(self, completions, **kwargs):
        self.order.append(text_of(completions[0]))
        assert self.release.wait(120)  # generous: released by the test once the queue holds what it checks
        return [1.0] * len(completions)


def wait_for(predicate, what: str) -> None:
    """Poll a server state the test caused (a barrier, not a timing assumption); generous bound."""
    import time

    deadline = time.monotonic() + 60
    while not predicate():
        assert time.monotonic() < deadline, f"never reached: {what}"
        time.sleep(0.01)


def test_a_full_queue_answers_503_with_retry_after_and_batches_go_in_arrival_order(capfd):
    import threading

    from grpokit.rewards.remote import RemoteReward

    gate = Gate()
    runner = RewardRunner([gate], isolate=False)
    server = serve(runner, options=ServeOptions(max_queue=2))
    port, queue = server.server_address[1], server.service.queue
    answers: dict[str, int] = {}

    def send(name: str) -> None:
        answers[name] = exchange(port, score_json({"completions": [name]}))[0]

    threads = []
    try:
        for name, waiting in (("first", 0), ("second", 1), ("third", 2)):
            threads.append(threading.Thread(target=send, args=(name,)))
            threads[-1].start()
            wait_for(lambda w=waiting: queue.scoring == 1 and queue.waiting == w, f"{name} queued")
        status, headers, body = exchange(port, score_json({"completions": ["fourth"]}))  # 2 waiting: full
        assert status == 503 and int(headers["retry-after"]) >= 1
        assert "the server is busy (2 waiting, --max-queue 2)" in json.loads(body)["error"]
        # grpokit's client honours it: retried after Retry-After, by then the queue has room
        reward = RemoteReward(f"http://127.0.0.1:{port}/score", retries=3, backoff=0)
        logged: dict[str, float] = {}
        late = threading.Thread(
            target=lambda: answers.setdefault("client", reward(["p"], ["client"], logged.__setitem__))
        )
        late.start()
        wait_for(lambda: server.service.metrics.rejected == 2, "the client's first try refused")
        gate.release.set()
        for thread in [*threads, late]:
            thread.join(120)
    finally:
        gate.release.set()
        stop(server)
        runner.close()
    assert gate.order == ["first", "second", "third", "client"]
    assert answers["first"] == answers["second"] == answers["third"] == 200
    assert answers["client"] == [1.0] and logged["remote/retries"] >= 1
    assert "Traceback" not in capfd.readouterr().err
