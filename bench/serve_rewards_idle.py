"""Idle half-open connections against a reward server: `python bench/serve_rewards_idle.py [--connections N]`.

Opens N connections that each send half a request line and wait, then counts the server process's threads and
resident memory and times one GET /health on a new connection; after --hold seconds, counts how many of the N the
server has closed. Servers, each in its own subprocess so the counts are the server's own: grpokit's serve-rewards
(uvicorn + h11, its default 10 s header timeout), the standard library's ThreadingHTTPServer with a 60 s read
timeout (what serve-rewards was built on until issue 60: one thread a connection), and a bare uvicorn + h11 app.
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
STDLIB = """
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
class Handler(BaseHTTPRequestHandler):
    timeout = 60.0
    protocol_version = "HTTP/1.1"
    def log_message(self, *args):
        pass
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", "16")
        self.end_headers()
        self.wfile.write(b'{"status": "ok"}')
server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
server.daemon_threads = True
server.request_queue_size = 4096
print(server.server_address[1], flush=True)
server.serve_forever()
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


def proc_status(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as lines:
        return int(next(line for line in lines if line.startswith(field + ":")).split()[1])


def closed_by_server(conn: socket.socket) -> bool:
    """Whether the server closed ``conn`` (after an answer, such as grpokit's 408, or none); closes it here."""
    conn.setblocking(False)
    try:
        while conn.recv(65536):
            pass
        return True  # end of stream
    except BlockingIOError:
        return False  # still open, nothing more to read
    except OSError:
        return True  # reset
    finally:
        conn.close()


def measure(name: str, code: str, n: int, hold: float) -> dict:
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        port = int(proc.stdout.readline())
        rss_before = proc_status(proc.pid, "VmRSS")
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
        peak, rss_kib = proc_status(proc.pid, "Threads"), proc_status(proc.pid, "VmRSS")
        time.sleep(hold)
        closed = sum(closed_by_server(s) for s in idle)
        status = answer.split(b"\r\n", 1)[0].decode(errors="replace")
        return {
            "server": name,
            "connections": n,
            "threads": peak,
            "rss_mib": round(rss_kib / 1024, 1),
            "rss_before_mib": round(rss_before / 1024, 1),
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
    parser.add_argument("--only", default=None, help="run only the servers whose name contains this")
    args = parser.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, 4 * args.connections)), hard))
    servers = (
        ("grpokit serve-rewards (uvicorn + h11)", GRPOKIT),
        ("http.server ThreadingHTTPServer (the old base)", STDLIB),
        ("uvicorn 0.54 + h11, bare app", UVICORN),
    )
    for name, code in servers:
        if args.only is not None and args.only not in name:
            continue
        print(json.dumps(measure(name, code, args.connections, args.hold)), flush=True)


if __name__ == "__main__":
    main()
