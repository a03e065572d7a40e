"""Remote rewards: a run scored through `grpokit serve-rewards`, an OpenRLHF-format server written here with the
standard library, and servers that die, hang or answer garbage. Order is shown by events, not by sleeping; the
one timeout that must exist (a hanging server) is the reward's own, set short here, and asserted by its kind."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml
from shared_helpers import REWARD_FILE, TARGET_REWARD, tiny_run_config

from grpokit.cli import main
from grpokit.rewards import RewardError, RewardRunner
from grpokit.store import RolloutStore

LENGTH_REWARD = f"{REWARD_FILE}:target_fraction"


def write_config(tmp_path: Path, model_dir: Path, rewards: list, name: str = "run", **settings) -> Path:
    return tiny_run_config(
        tmp_path,
        model_dir,
        max_steps=3,
        rewards=rewards,
        name=name,
        algo={"beta": 0.0},
        eval={"eval_steps": 0},
        reward=settings,
    )


def _metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def _rollouts(run: Path) -> list[dict]:
    with RolloutStore(run, readonly=True) as store:
        return store.rollouts()


class ServeRewards:
    """`grpokit serve-rewards` in a subprocess on a free loopback port; its first stdout line gives the URL."""

    def __init__(self, *args: str, env: dict | None = None):
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path), OMP_NUM_THREADS="1", **(env or {}))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "grpokit.cli", "serve-rewards", *args, "--port", "0"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        line = self.proc.stdout.readline()  # blocks until the server listens (or the command ended)
        assert "serving rewards" in line, line + self.proc.stderr.read()
        self.url = line.split(" on ")[1].split()[0]

    def stop(self, signum: int = 15) -> tuple[int, str]:
        self.proc.send_signal(signum)
        _, err = self.proc.communicate(timeout=120)  # generous: a busy machine; it ends at once
        return self.proc.returncode, err


def test_a_run_through_serve_rewards_equals_the_run_in_process(tmp_path, tiny_model_dir):
    rewards = [TARGET_REWARD, {"name": "length", "target_length": 3, "unit": "chars", "weight": 0.5}]
    served = tmp_path / "served.yaml"
    served.write_text(yaml.safe_dump({"rewards": rewards}))
    server = ServeRewards(str(served))
    try:
        local = write_config(tmp_path, tiny_model_dir, rewards, name="local")
        remote = write_config(
            tmp_path, tiny_model_dir, [{"url": server.url + "/score", "format": "grpokit", "retries": 0}], name="remote"
        )
        assert main(["train", str(local)]) == 0
        assert main(["train", str(remote)]) == 0
    finally:
        code, err = server.stop()
    assert code == 143 and err.strip() == "grpokit: stopped by SIGTERM"  # graceful: one line, no traceback
    here, there = _metrics(tmp_path / "local"), _metrics(tmp_path / "remote")
    assert [m["reward"] for m in here] == [m["reward"] for m in there]
    assert [m["reward_std"] for m in here] == [m["reward_std"] for m in there]
    assert [m["remote/request_errors"] for m in there] == [0.0, 0.0, 0.0]
    assert all(m["remote/latency_s"] >= 0 for m in there)
    local_rows, remote_rows = _rollouts(tmp_path / "local"), _rollouts(tmp_path / "remote")
    assert [r["completion"] for r in local_rows] == [r["completion"] for r in remote_rows]
    assert [r["reward"] for r in local_rows] == [r["reward"] for r in remote_rows]
    assert all(r["error"] is None for r in remote_rows)


class OpenRLHFServer:
    """An OpenRLHF-format reward server written with the standard library, not grpokit: reward 1 when the query
    (prompt + completion) contains its label, 0 otherwise, and len(query) as an extra log."""

    def __init__(self):
        self.requests: list[dict] = []

        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.requests.append(body)
                rewards = [float(label in q) for q, label in zip(body["query"], body["labels"])]
                data = json.dumps(
                    {
                        "rewards": rewards,
                        "scores": rewards,
                        "extra_logs": {"query_len": [len(q) for q in body["query"]]},
                    }
                ).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/get_reward"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def test_an_openrlhf_server_written_here_is_scored_correctly():
    server = OpenRLHFServer()
    try:
        spec = {"url": server.url, "format": "openrlhf", "batch_size": 2, "retries": 0}
        with RewardRunner([spec], isolate=True) as runner:
            result = runner.score(
                ["Q1 ", "Q2 ", "Q3 "], ["the answer is 7", "it is 9", "no idea"], {"answer": ["7", "8", "idea"]}
            )
    finally:
        server.close()
    assert result.per_func[:, 0].tolist() == [1.0, 0.0, 1.0]
    assert result.errors == [None, None, None]
    # batch_size 2: two requests; each query is the prompt followed by its completion, labels from `answer`
    assert sorted((r["query"], r["prompts"], r["labels"]) for r in server.requests) == [
        (["Q1 the answer is 7", "Q2 it is 9"], ["Q1 ", "Q2 "], ["7", "8"]),
        (["Q3 no idea"], ["Q3 "], ["idea"]),
    ]
    assert sorted(result.logged["remote/query_len"]) == [10.0, 10.0, 18.0]


class FaultyServer:
    """A server that answers garbage, or hangs until released, or answers its first `healthy` requests and then
    goes away (its socket closed: connections refused from then on)."""

    def __init__(self, mode: str, healthy: int = 0):
        self.release = threading.Event()
        self.count = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.count += 1
                if mode == "hang":
                    outer.release.wait()
                    return
                if mode == "dies" and outer.count > healthy:  # as a killed server: no answer, nothing listening
                    outer.server.socket.shutdown(socket.SHUT_RDWR)  # stops listening: connections are refused
                    self.connection.shutdown(socket.SHUT_RDWR)
                    self.close_connection = True
                    return
                n = len(body["completions"])
                data = b"<html>oops</html>" if mode == "garbage" else json.dumps({"rewards": [0.5] * n}).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/score"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.parametrize(
    ("mode", "kind"),
    [("garbage", "the answer is not JSON"), ("hang", "timed out after 0.5 s"), ("dies", "ConnectError")],
)
def test_a_bad_server_gives_stored_errors_and_the_run_finishes(tmp_path, tiny_model_dir, mode, kind):
    server = FaultyServer(mode, healthy=1)
    spec = {"url": server.url, "timeout": 0.5, "retries": 1, "backoff": 0, "label": "judge"}
    config = write_config(tmp_path, tiny_model_dir, [spec, LENGTH_REWARD], reward_timeout=60)
    try:
        assert main(["train", str(config)]) == 0
    finally:
        server.close()
    rows = _rollouts(tmp_path / "run")
    failed_steps = {2, 3} if mode == "dies" else {1, 2, 3}
    for r in rows:
        if r["step"] in failed_steps:
            assert (
                r["rewards"]["judge"] is None
                and r["error"].startswith("judge: http://127.0.0.1")
                and kind in r["error"]
            )
        else:
            assert r["rewards"]["judge"] == 0.5 and r["error"] is None
    metrics = _metrics(tmp_path / "run")
    assert [m["rewards/judge/errors"] for m in metrics] == [8.0 * (m["step"] in failed_steps) for m in metrics]


def test_a_run_whose_only_reward_is_a_dead_server_stops_with_one_line(tmp_path, tiny_model_dir, capsys):
    server = FaultyServer("garbage")
    spec = {"url": server.url, "retries": 0}
    try:
        assert main(["train", str(write_config(tmp_path, tiny_model_dir, [spec]))]) == 2
    finally:
        server.close()
    err = capsys.readouterr().err
    assert "grpokit: error: every reward function failed on every completion of the first batch" in err
    assert "Traceback" not in err


def test_a_served_reward_killed_mid_run_gives_errors_then_no_crash(tmp_path):
    server = ServeRewards(TARGET_REWARD)
    spec = {"url": [server.url + "/score"], "retries": 1, "backoff": 0}
    try:
        with RewardRunner([spec, LENGTH_REWARD]) as runner:
            first = runner.score(["a", "b"], ["w7 w7", "w1 w7"], {"target": ["w7", "w7"]})
            server.proc.kill()
            server.proc.wait()
            second = runner.score(["a", "b"], ["w7 w7", "w1 w7"], {"target": ["w7", "w7"]})
    finally:
        if server.proc.poll() is None:
            server.proc.kill()
    assert first.per_func[:, 0].tolist() == [1.0, 0.5] and first.errors == [None, None]
    assert second.per_func[:, 0].isnan().all() and all("ConnectError" in e for e in second.errors)
    assert second.per_func[:, 1].tolist() == [1.0, 0.5]  # the local reward still scores


def test_a_token_is_required_off_loopback_and_checked_on_every_request(tmp_path):
    assert main(["serve-rewards", TARGET_REWARD, "--host", "0.0.0.0"]) == 2
    server = ServeRewards(TARGET_REWARD, env={"GRPOKIT_REWARD_TOKEN": "s3cret"})
    try:
        cmdline = Path(f"/proc/{server.proc.pid}/cmdline").read_bytes()
        assert b"s3cret" not in cmdline  # the token is not on the command line, where `ps` shows it
        bad = {"url": server.url + "/score", "retries": 0, "headers": {"Authorization": "Bearer wrong"}}
        good = {"url": server.url + "/score", "retries": 0, "headers": {"Authorization": "Bearer ${GRPOKIT_T}"}}
        os.environ["GRPOKIT_T"] = "s3cret"
        with RewardRunner([bad, good], isolate=True) as runner:
            values = runner.score_values(["a"], ["w7"], {"target": ["w7"]})
    finally:
        os.environ.pop("GRPOKIT_T", None)
        server.stop()
    assert "HTTP 401" in values.messages[0][0] and values.per_func[0, 1].item() == 1.0


def test_rewards_error_for_a_bad_spec():
    with pytest.raises(ValueError, match="format must be one of"):
        RewardRunner([{"url": "http://127.0.0.1:1/x", "format": "verl"}])
    with pytest.raises(ValueError, match="url must be"):
        RewardRunner([{"url": "127.0.0.1:1"}])
    assert issubclass(RewardError, ValueError)
