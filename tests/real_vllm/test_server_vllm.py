"""vllm_mode: server against a real ``vllm serve`` (vLLM's CPU build), started by ``grpokit vllm-serve`` on a free
loopback port (one thread, eager, the Makefile's small KV cache): training in float32 with the sampler-learner
log-prob gap <= GAP_FP32 after every sync, the server killed mid-run (the run ends with one line naming the URL),
a resume on a fresh server equal to the uninterrupted run, and a skipped weight push stopping the run. Then
max_staleness 2 (the producer's thread drives the server) with partial rollouts after 4 of 8 tokens: every stored
sample within the bound, each completion longer than 4 tokens in two pieces [[0, v], [4, min(v + 1, b - 1)]], the
float32 gap after every push (heads and continuations), and kill -9 of the run twice, resumed, equal to the
uninterrupted run. The server's key: a default ``grpokit vllm-serve`` answers 401 without its key on the dev routes
and /v1, writes its key to a 0600 file that the keyless runs here find, a wrong key ends a run in one line, and
``--host 0.0.0.0`` without a key does not start.

One server at a time: the module's server is started once and restarted only after the test that kills it."""

from __future__ import annotations

import contextlib
import gc
import json
import os
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from real_vllm_helpers import GAP_FP32, SETTINGS, TARGET_REWARD, check_token_versions, metrics, prompts
from safetensors.torch import load_file
from shared_helpers import kill_storm, logged_steps, stored

from grpokit import GRPOConfig, GRPOTrainer
from grpokit.rollout.vllm.http import VLLMServerError
from grpokit.rollout.vllm.weights import SyncGapError
from grpokit.store import RolloutStore

COMPARED = ("loss", "policy_loss", "kl", "grad_norm", "reward", "sampling_is/logprob_abs_diff")
START_TIMEOUT_S = 900  # a bound on a server's start on a busy 2-core machine (measured 45-130 s)


class Server:
    """A ``grpokit vllm-serve`` process (its own session: killing it takes vLLM's engine process with it)."""

    def __init__(self, model_dir, log_dir):
        self.model_dir, self.log_dir, self.proc, self.url = model_dir, log_dir, None, None

    def start(self) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        self.log = open(self.log_dir / f"server-{port}.log", "w")  # noqa: SIM115 (closed in stop)
        args = ["--port", str(port), "--dtype", "float32", "--enforce-eager", "--max-model-len", "128"]
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "grpokit.cli", "vllm-serve", str(self.model_dir), *args],
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        import httpx

        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, (self.log_dir / f"server-{port}.log").read_text()[-4000:]
            try:
                if httpx.get(self.url + "/health", timeout=5).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(1)
        raise AssertionError(f"the vLLM server did not start within {START_TIMEOUT_S} s")

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL to the server's whole session (the API server and vLLM's engine process)."""
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=120)
            self.log.close()
            self.proc = None


@pytest.fixture(scope="module")
def key_folder(tmp_path_factory):
    """The servers' key files in a folder of this module's own (XDG_RUNTIME_DIR, read by the servers and by the
    trainers, in this process and in the CLI's), and no VLLM_API_KEY: the trainers find the keys with no setting."""
    with pytest.MonkeyPatch.context() as mp:
        folder = tmp_path_factory.mktemp("runtime")
        mp.setenv("XDG_RUNTIME_DIR", str(folder))
        mp.delenv("VLLM_API_KEY", raising=False)
        yield folder


@pytest.fixture(scope="module")
def server(vllm_model_dir, tmp_path_factory, key_folder):
    s = Server(vllm_model_dir, tmp_path_factory.mktemp("vllm-server"))
    s.start()
    yield s
    s.kill()


def trainer(model_dir, run, url, callbacks=None, trl_form=False, **overrides) -> GRPOTrainer:
    """grpokit's keys; ``trl_form``: a TRL script's (use_vllm=True, vllm_mode="server", host and port)."""
    values = {**SETTINGS, "vllm_mode": "server", "vllm_server_timeout": 120}
    if trl_form:
        del values["engine"]
        host, port = url.removeprefix("http://").split(":")
        values.update(use_vllm=True, vllm_server_host=host, vllm_server_port=int(port))
    else:
        values["vllm_server_base_url"] = url
    args = GRPOConfig(**{**values, "dtype": "float32", "output_dir": str(run), **overrides})
    return GRPOTrainer(str(model_dir), TARGET_REWARD, args=args, train_dataset=prompts(), callbacks=callbacks)


def completions(run) -> list[tuple]:
    with RolloutStore(run / "rollouts.sqlite", readonly=True) as store:
        return [(r["step"], r["prompt_index"], r["completion"]) for r in store.rollouts()]


class KillAtStep:
    """Kills the server at the end of step ``step`` (before that step's checkpoint is written)."""

    def __init__(self, server, step):
        self.server, self.step = server, step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            self.server.kill()


COMMON = dict(lr_scheduler_type="constant", save_steps=1, max_steps=3)


# ---- the server's key -------------------------------------------------------------------------------------------
def test_the_default_server_answers_401_without_its_key_on_every_route_but_health(server, key_folder):
    import httpx

    from grpokit.rollout.vllm.keys import key_path, read_key

    port = int(server.url.rsplit(":", 1)[1])
    path = key_path(port)
    assert path.parent.parent.parent == key_folder  # the module's own XDG_RUNTIME_DIR
    key = read_key(path)
    assert key and stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert key.encode() not in Path(f"/proc/{server.proc.pid}/cmdline").read_bytes()  # not in `ps`
    rpc = {"method": "reload_weights", "kwargs": {"weights_path": "/nonexistent"}}
    body = {"model": str(server.model_dir), "prompt": [5, 6], "max_tokens": 2}
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": key}):  # none, wrong, not Bearer
        with httpx.Client(base_url=server.url, headers=headers, timeout=60) as http:
            answers = {
                route: http.post(route, json=payload).status_code
                for route, payload in (
                    ("/collective_rpc", rpc),
                    ("/v1/completions", body),
                    ("/reset_prefix_cache", None),
                    ("/init_weight_transfer_engine", {"init_info": {}}),
                    ("/update_weights", {"update_info": {}}),
                )
            }
            answers["/server_info"] = http.get("/server_info").status_code
            answers["/health"] = http.get("/health").status_code
        print("without the key:", headers and "wrong or not Bearer", answers)
        assert answers.pop("/health") == 200 and set(answers.values()) == {401}, answers
    with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {key}"}, timeout=60) as http:
        assert http.get("/server_info").status_code == 200 and http.get("/v1/models").status_code == 200


def test_a_wrong_key_ends_the_run_in_one_line_naming_vllm_server_api_key(server, vllm_model_dir, tmp_path):
    if not server.running():
        server.start()
    with pytest.raises(VLLMServerError) as refused:
        trainer(vllm_model_dir, tmp_path / "wrong", server.url, vllm_server_api_key="not-its-key").train()
    text = str(refused.value)
    assert "\n" not in text and "answered HTTP 401: the key sent (vllm_server_api_key) is not its key" in text, text
    assert text.startswith(f"vLLM server {server.url}: ") and "set vllm_server_api_key" in text


def test_a_host_beyond_loopback_without_a_key_does_not_start(vllm_model_dir, key_folder):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    argv = [sys.executable, "-m", "grpokit.cli", "vllm-serve", str(vllm_model_dir), "--host", "0.0.0.0", "--port",
            str(port)]  # fmt: skip
    proc = subprocess.run(argv, env=dict(os.environ, HF_HUB_OFFLINE="1"), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0, proc.stderr[-3000:]
    assert proc.stderr.startswith("grpokit: error: grpokit vllm-serve --host 0.0.0.0 ") and "--api-key" in proc.stderr
    assert not list(key_folder.rglob(f"*-{port}"))  # no key file either
    with socket.socket() as s:  # nothing listens there
        assert s.connect_ex(("127.0.0.1", port)) != 0


def test_training_keeps_the_server_in_sync_after_every_push(server, vllm_model_dir, tmp_path):
    """Configured as a TRL script is: use_vllm=True, vllm_mode="server", vllm_server_host / vllm_server_port."""
    run = tmp_path / "straight"
    t = trainer(vllm_model_dir, run, server.url, trl_form=True, **COMMON)
    assert (t.args.engine, t.args.vllm_mode) == ("vllm", "server")
    t.train()
    lines = metrics(run)
    print("sampling_is/logprob_abs_diff per step:", [line["sampling_is/logprob_abs_diff"] for line in lines])
    assert [line["step"] for line in lines] == [1, 2, 3]
    for line in lines:  # each step samples after a push of the learner's current weights
        assert line["sampling_is/logprob_abs_diff"] <= GAP_FP32, line
        assert torch.isfinite(torch.tensor(line["loss"]))
    assert len({line["loss"] for line in lines}) == 3


def test_a_killed_server_ends_the_run_and_a_resume_continues_exactly(server, vllm_model_dir, tmp_path):
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    trainer(vllm_model_dir, straight, server.url, **COMMON).train()
    url = server.url
    t = trainer(vllm_model_dir, resumed, url, callbacks=[KillAtStep(server, 2)], **COMMON)
    with pytest.raises(VLLMServerError) as ended:  # step 3's weight push finds no server
        t.train()
    text = str(ended.value)
    assert "\n" not in text and f"vLLM server {url}: /collective_rpc failed" in text
    assert "vllm_server_timeout=120 s" in text
    del t
    gc.collect()
    assert [line["step"] for line in metrics(resumed)] == [1, 2]
    server.start()  # a fresh server, from the model's folder: the resumed run pushes the checkpoint's weights
    trainer(vllm_model_dir, resumed, server.url, resume_from="latest", **COMMON).train()
    a, b = metrics(straight), metrics(resumed)
    assert [line["step"] for line in b] == [1, 2, 3]
    for key in COMPARED:
        assert b[2][key] == pytest.approx(a[2][key], abs=1e-6), key
    assert b[2]["sampling_is/logprob_abs_diff"] <= GAP_FP32
    assert completions(straight) == completions(resumed)
    print("step 3, straight and resumed:", {key: (a[2][key], b[2][key]) for key in COMPARED})


def test_a_skipped_weight_push_stops_the_run_naming_the_server(server, vllm_model_dir, tmp_path, monkeypatch):
    """The server keeps its own weights after the first push: step 2 samples from the step-0 policy."""
    from grpokit.rollout.vllm import server_weights as vllm_server_weights

    pushes = []
    real = vllm_server_weights.SharedMemoryPush.push
    monkeypatch.setattr(
        vllm_server_weights.SharedMemoryPush,
        "push",
        lambda self, version, model: pushes.append(version) or (real(self, version, model) if version == 0 else None),
    )
    if not server.running():
        server.start()
    run = tmp_path / "broken"
    with pytest.raises(SyncGapError) as stopped:
        trainer(vllm_model_dir, run, server.url, max_steps=3).train()
    text = str(stopped.value)
    assert text.startswith(f"step 2: vLLM server {server.url} samples with other weights"), text
    assert "vllm_max_logprob_gap=0.0001" in text
    gaps = [line["sampling_is/logprob_abs_diff"] for line in metrics(run)]
    print("a skipped push: sampling_is/logprob_abs_diff per step:", gaps)
    assert pushes == [0, 1] and len(gaps) == 2 and gaps[0] <= GAP_FP32 and gaps[1] > 1e-4


# ---- max_staleness K = 2: the producer's thread drives the server (grpokit/train/experience/server_ahead.py) -------
# with partial rollouts (server_partial.py): tokens 0-3 by the batch's admitted version, the rest by the next
ASYNC_STEPS, ASYNC_K, KILLS, KILL_SEED, PARTIAL_S = 5, 2, 2, 4321, 4
ASYNC_COMPARED = ("loss", "policy_loss", "kl", "grad_norm", "reward", "policy_staleness", "policy_staleness_token_mean",
                  "sampling_is/weight_mean")  # fmt: skip


def async_config(tmp_path, model_dir, url: str, name: str):
    """The CLI's config of a K = 2 run against the server (decoupled PPO, partial rollouts after PARTIAL_S tokens, a
    checkpoint every step)."""
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in prompts()))
    values = {**SETTINGS, "vllm_mode": "server", "vllm_server_base_url": url, "vllm_server_timeout": 120,
              "model_name_or_path": str(model_dir), "train_dataset": str(data), "output_dir": str(tmp_path / name),
              "dtype": "float32", "max_steps": ASYNC_STEPS, "lr_scheduler_type": "constant", "save_steps": 1,
              "max_staleness": ASYNC_K, "off_policy_correction": "decoupled_ppo",
              "vllm_partial_rollout_tokens": PARTIAL_S, "rewards": [TARGET_REWARD]}  # fmt: skip
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(values))
    return path


def cli(config, *extra: str) -> list[str]:
    return [sys.executable, "-m", "grpokit.cli", "train", str(config), *extra]


def cli_env() -> dict:
    return dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="1")


@pytest.fixture(scope="module")
def async_straight(server, vllm_model_dir, tmp_path_factory):
    """An uninterrupted K = 2 run through the CLI against the module's server: its folder."""
    if not server.running():
        server.start()
    tmp = tmp_path_factory.mktemp("async-straight")
    config = async_config(tmp, vllm_model_dir, server.url, "straight")
    # timeout: a bound for a run on a busy 2-core machine (~1 min)
    done = subprocess.run(cli(config), env=cli_env(), capture_output=True, text=True, timeout=900, check=False)
    assert done.returncode == 0, done.stderr[-6000:]
    return tmp / "straight"


def test_k2_samples_ahead_from_the_server_within_the_bound_and_in_sync_after_every_push(async_straight):
    lines = logged_steps(async_straight)
    assert [m["step"] for m in lines] == list(range(1, ASYNC_STEPS + 1))
    # step s trains version s - 1 on a batch admitted with version max(0, s - 1 - K)
    assert [m["policy_staleness"] for m in lines] == [min(s - 1, ASYNC_K) for s in range(1, ASYNC_STEPS + 1)]
    # tokens [0, 4) by v = max(0, b - 1 - K), from 4 on by min(v + 1, b - 1): [[0, v], [4, w]] per long completion
    check_token_versions(async_straight, lines, ASYNC_K, PARTIAL_S)
    # the sync: after each push the copy at the pushed version against the server's log-probs, float32 both sides
    gaps = [m["vllm_server_sync_gap_max"] for m in lines]
    print("vllm_server_sync_gap_max per step:", gaps)
    assert all(gap <= GAP_FP32 for gap in gaps), gaps
    # the continuations' pushes on their own (from step 2: batch 1 has none, batch 2's waits for version 1)
    continued = [m["vllm_server_sync_gap_continued_max"] for m in lines[1:]]
    print("vllm_server_sync_gap_continued_max per step:", continued)
    assert all(gap <= GAP_FP32 for gap in continued), continued
    # batches 2, 3 admitted at 0 and continued at 1 alternate the server's one set of weights; then one push a batch:
    # 0 (batch 1), 1, 0, 1 (batches 2, 3), 2 (batch 4's continuations), 3 (batch 5's)
    assert lines[-1]["vllm_server_pushes"] == 6
    # the learner-side gap measures the staleness (2 updates at lr 1e-2), far above what would stop a synchronous run
    stale = [m["sampling_is/logprob_abs_diff"] for m in lines]
    print("sampling_is/logprob_abs_diff per step (staleness):", stale)
    assert stale[0] <= GAP_FP32 and max(stale[ASYNC_K:]) > 1e-4


def test_kill_9_on_a_k2_server_run_then_resume_equals_the_uninterrupted_run(
    server, async_straight, vllm_model_dir, tmp_path
):
    """The run is killed, not the server: each resume pushes its checkpoint's weights before its first new batch."""
    config, run = async_config(tmp_path, vllm_model_dir, server.url, "run"), tmp_path / "run"
    env = cli_env()
    history = kill_storm(cli(config, "resume_from=latest"), run, env, tmp_path, KILLS, KILL_SEED, start_timeout=600)
    final = subprocess.run(cli(config, "resume_from=latest"), env=env, capture_output=True, text=True,
                           timeout=900, check=False)  # fmt: skip
    assert final.returncode == 0, "\n".join(history) + "\n" + final.stderr[-6000:]
    assert stored(run) == stored(async_straight), "\n".join(history)
    straight, resumed = logged_steps(async_straight), logged_steps(run)
    assert [m["step"] for m in resumed] == list(range(1, ASYNC_STEPS + 1)), "\n".join(history)
    for a, b in zip(straight, resumed, strict=True):
        for key in ASYNC_COMPARED:
            assert a[key] == pytest.approx(b[key], abs=1e-6), (a["step"], key, history)
        # a resume's steps that train the checkpoint's batches push nothing and check nothing: no metric there (a
        # checkpoint after step 3 holds steps 4 and 5, so such a resume never pushes)
        assert b.get("vllm_server_sync_gap_max", 0.0) <= GAP_FP32, (b["step"], history)
        assert b.get("vllm_server_sync_gap_continued_max", 0.0) <= GAP_FP32, (b["step"], history)
    assert resumed[0]["vllm_server_sync_gap_max"] <= GAP_FP32  # step 1 samples fresh: a push and its check
    wa = load_file(async_straight / "final" / "model.safetensors")
    wb = load_file(run / "final" / "model.safetensors")
    for name in wa:
        torch.testing.assert_close(wa[name], wb[name], atol=1e-6, rtol=0)
    print("kills:", history)
