"""Idle half-open connections against a reward server: `python bench/serve_rewards_idle.py [--connections N]`.

Opens N connections that each send half a request line and wait, then counts the server process's threads and
times one GET /health on a new connection; after --hold seconds, counts how many of the N the server has closed.
Servers: grpokit's serve-rewards (http.server, one thread a connection) and a bare uvicorn + h11 app (the
candidate of docs/security_reports_serve.md), each in its own subprocess so the thread count is the server's own.
"""

from __future__ import annotations

import argparse
import json
import resource
import socket
import subprocess
import sys
import time

GRPOKIT = """
import sys, threading
from grpokit.rewards.serve import serve
class Runner:
    names = ["none"]
server = serve(Runner(), "127.0.0.1", 0)
print(server.server_address[1], flush=True)
threading.Event().wait()
"""
UVICORN = """
import socket, uvicorn
async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": b'{"status": "ok"}'})
sock = socket.socket(); sock.bind(("127.0.0.1", 0)); sock.listen(4096); print(sock.getsockname()[1], flush=True)
uvicorn.Server(uvicorn.Config(app, http="h11", log_level="error", limit_concurrency=4096, backlog=4096)).run(
    sockets=[sock])
"""


def threads(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        return int(next(line for line in status if line.startswith("Threads:")).split()[1])


def measure(name: str, code: str, n: int, hold: float) -> dict:
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        port = int(proc.stdout.readline())
        idle = []
        for _ in range(n):
            s = socket.create_connection(("127.0.0.1", port), timeout=10)
            s.sendall(b"POST /score HT")
            idle.append(s)
        time.sleep(1.0)
        began = time.monotonic()
        with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
            s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            answer = s.recv(100)
        seconds = time.monotonic() - began
        peak = threads(proc.pid)
        time.sleep(hold)
        closed = 0
        for s in idle:
            s.setblocking(False)
            try:
                closed += s.recv(1) == b""
            except BlockingIOError:
                pass
            except OSError:
                closed += 1
            s.close()
        status = answer.split(b"\r\n", 1)[0].decode(errors="replace")
        return {
            "server": name,
            "connections": n,
            "threads": peak,
            "health": status,
            "health_s": round(seconds, 3),
            f"closed_after_{hold:g}s": closed,
        }
    finally:
        proc.kill()
        proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--connections", type=int, default=1500)
    parser.add_argument("--hold", type=float, default=15.0)
    args = parser.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, 4 * args.connections)), hard))
    for name, code in (("grpokit serve-rewards (http.server)", GRPOKIT), ("uvicorn 0.54 + h11, bare app", UVICORN)):
        print(json.dumps(measure(name, code, args.connections, args.hold)), flush=True)


if __name__ == "__main__":
    main()
