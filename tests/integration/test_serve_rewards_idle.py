"""`grpokit serve-rewards` under a flood of idle half-open connections (issue: 1,500 of them, each having sent half a
request line, took the old http.server to 340 threads). The server runs as a subprocess on loopback so that its
thread count (/proc/PID/task) is its own. Counts, not times: the flood is complete when the server holds a socket for
each connection (its /proc/PID/fd); the one deadline, 5 s for a valid request's answer, is the issue's criterion and
generous for an answer that takes milliseconds; the header timeout's closes are counted one by one."""

from __future__ import annotations

import contextlib
import json
import os
import resource
import selectors
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from shared_helpers import TARGET_REWARD

FLOOD = 1500
SILENT = 50  # connections that send nothing at all
HEADER_TIMEOUT = 20.0  # long enough for the flood and the valid request on a busy machine; the closes wait for it
MAX_THREADS = 100


def raise_open_files(wanted: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < wanted:
        pytest.skip(f"the hard limit of open files is {hard}, under the {wanted} this test needs (ulimit -Hn)")
    if soft != resource.RLIM_INFINITY and soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))


def sockets_held(pid: int) -> int:
    count = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):  # closed while listed
            count += os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:")
    return count


def threads(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def wait_for(predicate, what: str, bound: float = 120.0) -> None:
    """Poll a state the test caused (a barrier, not a timing assumption); generous bound."""
    deadline = time.monotonic() + bound
    while not predicate():
        assert time.monotonic() < deadline, f"never reached: {what}"
        time.sleep(0.05)


def score(port: int, body: dict, deadline: float) -> tuple[int, dict]:
    data = json.dumps(body).encode()
    with socket.create_connection(("127.0.0.1", port), timeout=deadline) as conn:
        conn.sendall(
            b"POST /score HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: %d\r\n\r\n" % len(data) + data
        )
        answer = b""
        while chunk := conn.recv(65536):
            answer += chunk
    head, payload = answer.split(b"\r\n\r\n", 1)
    return int(head.split()[1]), json.loads(payload)


def read_all_until_closed(conns: list[socket.socket], bound: float) -> dict[socket.socket, bytes]:
    """Everything each connection receives until the server closes it."""
    got = {conn: b"" for conn in conns}
    selector = selectors.DefaultSelector()
    for conn in conns:
        conn.setblocking(False)
        selector.register(conn, selectors.EVENT_READ)
    deadline = time.monotonic() + bound
    open_ = len(conns)
    while open_:
        assert time.monotonic() < deadline, f"{open_} of {len(conns)} connections still open after {bound} s"
        for key, _ in selector.select(timeout=1.0):
            try:
                chunk = key.fileobj.recv(65536)
            except ConnectionResetError:
                chunk = b""
            if chunk:
                got[key.fileobj] += chunk
            else:
                selector.unregister(key.fileobj)
                open_ -= 1
    selector.close()
    return got


@pytest.mark.timeout(300)
def test_1500_half_open_connections_cost_no_thread_and_a_valid_request_is_answered(tmp_path: Path):
    raise_open_files(FLOOD + SILENT + 512)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path), OMP_NUM_THREADS="1")
    command = [sys.executable, "-m", "grpokit.cli", "serve-rewards", TARGET_REWARD, "--port", "0"]
    proc = subprocess.Popen(
        [*command, "--header-timeout", str(HEADER_TIMEOUT)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    conns: list[socket.socket] = []
    try:
        line = proc.stdout.readline()
        assert "serving rewards" in line, line + proc.stderr.read()
        port = int(line.split(" on ")[1].split()[0].rsplit(":", 1)[1])
        before = sockets_held(proc.pid)
        peak = threads(proc.pid)
        for i in range(FLOOD + SILENT):
            conn = socket.create_connection(("127.0.0.1", port), timeout=60)
            if i < FLOOD:
                conn.sendall(b"POST /score HT")  # half a request line, then nothing
            conns.append(conn)
            if i % 100 == 0:
                peak = max(peak, threads(proc.pid))
        wait_for(lambda: sockets_held(proc.pid) >= before + FLOOD + SILENT, "the server holding every connection")
        peak = max(peak, threads(proc.pid))
        assert peak < MAX_THREADS, f"{peak} threads with {FLOOD} half-open connections"
        # during the flood: a valid request, answered correctly; 2 of 4 words are "a" (0.5), 1 of 1 is "x" (1.0)
        status, answer = score(port, {"completions": ["a b a c", "x"], "columns": {"target": ["a", "x"]}}, 5.0)
        assert status == 200 and answer["rewards"] == [0.5, 1.0]
        assert threads(proc.pid) < MAX_THREADS
        # after the header timeout the server closes every one: a JSON 408 to those that sent a part, none to the rest
        got = read_all_until_closed(conns, bound=HEADER_TIMEOUT + 120)
        partial = [got[c] for c in conns[:FLOOD]]
        assert all(g.startswith(b"HTTP/1.1 408 ") for g in partial), {g[:40] for g in partial}
        reason = json.loads(partial[0].split(b"\r\n\r\n", 1)[1])["error"]
        assert reason == f"the request line and headers were not sent within {HEADER_TIMEOUT:g} s"
        assert all(got[c] == b"" for c in conns[FLOOD:])
        # and lets their sockets go (a few more sockets of its own, the reward worker's, may have opened since)
        wait_for(lambda: sockets_held(proc.pid) < before + 5, "the server releasing every connection")
    finally:
        for conn in conns:
            conn.close()
        proc.terminate()
        _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143 and err.strip() == "grpokit: stopped by SIGTERM", err
