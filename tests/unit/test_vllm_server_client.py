"""vllm_mode: server against a fake ``vllm serve`` on a loopback port (tests/unit/fake_vllm_server.py): the requests
the engine sends, the weight pushes, and every way the server fails ending in one line that names the URL and
the timeout. The real server: tests/real_vllm/test_server_vllm.py."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import pytest
import torch
import yaml
from fake_vllm_server import FakeVLLM
from shared_helpers import sampling_params

from grpokit.commands.vllm_serve import vllm_serve_command
from grpokit.rollout.vllm.http import ServerClient, VLLMServerError
from grpokit.rollout.vllm.keys import key_path, write_key
from grpokit.rollout.vllm.server import VLLMServerEngine
from grpokit.rollout.vllm.server_worker import EXTENSION
from grpokit.rollout.vllm.settings import VLLMSettings, vllm_spec
from grpokit.rollout.vllm.weights import SyncGapCheck, SyncGapError

# A bound on the wall time of a failing request, far above its timeout (1-2 s): it fails the test only on a hang
NO_HANG_S = 60


@pytest.fixture(autouse=True)
def own_keys(tmp_path, monkeypatch):
    """No key from the environment, and key files in a folder of the test's own (XDG_RUNTIME_DIR)."""
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def one_line(exc: BaseException) -> str:
    text = str(exc)
    assert "\n" not in text
    return text


# ---- the client --------------------------------------------------------------------------------------------------
def test_an_unreachable_server_is_one_line_naming_the_url_and_the_timeout():
    url = f"http://127.0.0.1:{free_port()}"
    client = ServerClient(url, timeout=1.0)
    start = time.monotonic()
    with pytest.raises(VLLMServerError) as waited:
        client.wait_ready()
    assert time.monotonic() - start < NO_HANG_S
    text = one_line(waited.value)
    assert url in text and "/health" in text and "vllm_server_timeout=1 s" in text and "not ready" in text
    with pytest.raises(VLLMServerError) as sent:
        client.request("POST", "/v1/completions", json={})
    assert "/v1/completions failed: ConnectError" in one_line(sent.value) and url in str(sent.value)


def test_a_hung_route_ends_at_the_timeout_with_one_line():
    with FakeVLLM() as fake:
        fake.hang.add("/v1/completions")
        client = ServerClient(fake.url, timeout=1.0)
        client.wait_ready()
        start = time.monotonic()
        with pytest.raises(VLLMServerError) as hung:
            client.request("POST", "/v1/completions", json={"n": 1})
        assert time.monotonic() - start < NO_HANG_S
    text = one_line(hung.value)
    assert f"vLLM server {fake.url}: /v1/completions did not answer within 1 s" in text
    assert "vllm_server_timeout=1 s" in text


def test_an_http_error_is_one_line_with_its_status():
    with FakeVLLM() as fake:
        fake.fail.add("/reset_prefix_cache")
        with pytest.raises(VLLMServerError, match=r"/reset_prefix_cache answered HTTP 500: \{\"error\": \"boom\"\}"):
            ServerClient(fake.url, 5).request("POST", "/reset_prefix_cache")


# ---- the engine ----------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def policy(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)


def engine_for(fake, policy, **settings) -> VLLMServerEngine:
    given = VLLMSettings(vllm_mode="server", vllm_server_base_url=fake.url, vllm_server_timeout=30, **settings)
    return VLLMServerEngine(policy, [2], 0, vllm_spec(given, None, False, None), seed=1)


def routes(fake) -> list[str]:
    return [route for route, _ in fake.calls if route not in ("/health", "/v1/models", "/server_info")]


def test_the_engine_samples_groups_and_pushes_each_version_once(policy):
    params = sampling_params(5, 0.9, top_k=7)
    with FakeVLLM() as fake:
        engine = engine_for(fake, policy)
        out = engine.generate([[5, 6], [7]], 4, params, seeds=[10, 20])
        again = engine.generate([[5, 6]], 2, params, seeds=[30])
        engine.sync_weights()
        engine.generate([[8]], 2, params, seeds=[40])
    # a push (reload, then the prefix cache reset) before the first sampling and after the update, not between
    assert routes(fake) == ["/collective_rpc", "/reset_prefix_cache", "/v1/completions", "/v1/completions",
                            "/v1/completions", "/collective_rpc", "/reset_prefix_cache", "/v1/completions"]  # fmt: skip
    rpcs = [body for route, body in fake.calls if route == "/collective_rpc"]
    assert [rpc["method"] for rpc in rpcs] == ["reload_weights", "reload_weights"]  # a server without the extension
    folders = [folder for folder, _ in fake.folders_seen]
    assert [files for _, files in fake.folders_seen] == [["model.safetensors"], ["model.safetensors"]]
    assert "-v0-" in folders[0] and "-v1-" in folders[1] and not any(os.path.exists(f) for f in folders)
    bodies = [body for route, body in fake.calls if route == "/v1/completions"]
    # one step's requests are sent concurrently, so they arrive in any order: find group 0's by its seed
    first = next(body for body in bodies if body["seed"] == 10)
    assert sorted(body["seed"] for body in bodies[:2]) == [10, 20] and [b["seed"] for b in bodies[2:]] == [30, 40]
    assert (first["prompt"], first["n"], first["seed"], first["logprobs"]) == ([5, 6], 4, 10, 0)
    assert (first["temperature"], first["top_k"], first["max_tokens"], first["stop_token_ids"]) == (0.9, 7, 5, [2])
    assert first["return_token_ids"] is True and first["model"] == "tiny" and "detokenize" not in first
    assert out.completion_ids.shape == (8, 3) and out.prompt_ids == [[5, 6], [7]]
    assert out.completion_ids[1].tolist() == [3 + (10 + 1 + t) % 30 for t in range(3)]  # group 0's sample 1
    assert out.completion_ids[4].tolist() == [3 + (20 + t) % 30 for t in range(3)]  # group 1's sample 0
    assert torch.equal(out.logprobs, torch.full((8, 3), -0.5)) and out.finish_reasons == ["length"] * 8
    assert out.policy_version == 0 and again.completion_ids.shape == (2, 3)


def test_greedy_groups_are_sent_as_n_1_requests(policy):
    with FakeVLLM() as fake:
        out = engine_for(fake, policy).generate([[5]], 3, sampling_params(4, greedy=True), seeds=[9])
    bodies = [body for route, body in fake.calls if route == "/v1/completions"]
    assert [(b["n"], b["temperature"]) for b in bodies] == [(1, 0.0)] * 3 and out.completion_ids.size(0) == 3


def test_a_server_from_grpokit_vllm_serve_reloads_through_the_extension(policy):
    with FakeVLLM(extension=EXTENSION) as fake:
        engine_for(fake, policy).generate([[5]], 2, sampling_params(3), seeds=[1])
    assert [body["method"] for route, body in fake.calls if route == "/collective_rpc"] == ["grpokit_reload_weights"]


def test_servers_without_processed_logprobs_or_dev_mode_are_refused_naming_the_flag(policy):
    with FakeVLLM(logprobs_mode="raw_logprobs") as fake, pytest.raises(VLLMServerError) as raw:
        engine_for(fake, policy)
    assert "--logprobs-mode processed_logprobs" in one_line(raw.value) and fake.url in str(raw.value)
    with FakeVLLM(dev_mode=False) as fake, pytest.raises(VLLMServerError, match="VLLM_SERVER_DEV_MODE=1"):
        engine_for(fake, policy)


def test_the_gap_bound_follows_the_servers_dtype(policy):
    with FakeVLLM(dtype="torch.bfloat16") as fake:
        assert engine_for(fake, policy).gap.max_gap == 1.0
    with FakeVLLM() as fake:
        engine = engine_for(fake, policy, vllm_max_logprob_gap=0.5)
    assert engine.gap.max_gap == 0.5 and engine.gap.path == f"vLLM server {fake.url}"


# ---- the server's key ---------------------------------------------------------------------------------------------
def test_the_key_goes_with_every_request_to_every_route(policy):
    from grpokit.rollout.vllm.server_weights import HTTPWeightSyncRoutes

    with FakeVLLM(key="k-1", extension=EXTENSION) as fake:
        engine = engine_for(fake, policy, vllm_server_api_key="k-1")
        engine.generate([[5]], 2, sampling_params(3), seeds=[1])
        engine.sync_weights()
        engine.generate([[6]], 2, sampling_params(3), seeds=[2])
        nccl = HTTPWeightSyncRoutes(engine.client)  # the CUDA learner's routes, over the same client
        nccl.init_weight_transfer_engine({"master_address": "127.0.0.1"})
        nccl.start_weight_update()
        nccl.update_weights({"names": []})
        nccl.finish_weight_update()
        nccl.shutdown_weight_transfer_engine()
        engine.client.request("GET", "/get_world_size")
    sent = {route for route, _ in fake.authorization}
    assert sent >= {"/health", "/v1/models", "/server_info", "/collective_rpc", "/reset_prefix_cache",
                    "/v1/completions", "/init_weight_transfer_engine", "/start_weight_update", "/update_weights",
                    "/finish_weight_update", "/shutdown_weight_transfer_engine", "/get_world_size"}  # fmt: skip
    assert {header for _, header in fake.authorization} == {"Bearer k-1"}
    assert len(fake.calls) == len(fake.authorization)  # every request answered, none refused


def test_a_missing_or_wrong_key_is_one_line_naming_vllm_server_api_key(policy, monkeypatch):
    with FakeVLLM(key="right") as fake:
        with pytest.raises(VLLMServerError) as missing:
            engine_for(fake, policy)
        with pytest.raises(VLLMServerError) as wrong:
            engine_for(fake, policy, vllm_server_api_key="wrong")
        monkeypatch.setenv("VLLM_API_KEY", "also-wrong")
        with pytest.raises(VLLMServerError) as from_env:
            engine_for(fake, policy)
    text = one_line(missing.value)
    assert text.startswith(f"vLLM server {fake.url}: /v1/models answered HTTP 401: no key was sent (no "), text
    assert "set vllm_server_api_key (or VLLM_API_KEY)" in text
    assert "the key sent (vllm_server_api_key) is not its key" in one_line(wrong.value)
    assert "the key sent (VLLM_API_KEY) is not its key" in one_line(from_env.value)
    assert all(route in ("/health", "/v1/models") for route, _ in fake.authorization)  # stopped at the first refusal


def test_a_keyless_trainer_finds_a_loopback_servers_key_file(policy, tmp_path):
    with FakeVLLM(key="filed-key") as fake:
        port = int(fake.url.rsplit(":", 1)[1])
        path = write_key(key_path(port), "filed-key")
        assert path.parent.parent.parent == tmp_path  # the test's own XDG_RUNTIME_DIR
        engine = engine_for(fake, policy)
        engine.generate([[5]], 2, sampling_params(3), seeds=[1])
    assert {header for _, header in fake.authorization} == {"Bearer filed-key"}
    assert "/collective_rpc" in [route for route, _ in fake.calls]  # pushed and sampled: accepted


# ---- the sync check ------------------------------------------------------------------------------------------------
def test_the_sync_gap_stops_above_its_bound_naming_the_path():
    check = SyncGapCheck("vLLM server http://h:1", "float32", "float32")
    check.stop(2, {"sampling_is/logprob_abs_diff": 9e-5})  # under 1e-4: a correct sync's float32 noise is ~1e-7
    check.stop(2, {})  # a step without the metric (no vLLM rows)
    with pytest.raises(SyncGapError, match=r"step 3: vLLM server http://h:1 samples .* by 0.0002 .*=0.0001;"):
        check.stop(3, {"sampling_is/logprob_abs_diff": 2e-4})
    mixed = SyncGapCheck("colocated vLLM", "bfloat16", "float32")
    mixed.stop(1, {"sampling_is/logprob_abs_diff": 0.9})  # bf16 on one side: 1 nat per token
    with pytest.raises(SyncGapError, match="colocated vLLM"):
        mixed.stop(1, {"sampling_is/logprob_abs_diff": 1.1})
    assert SyncGapCheck("p", "float32", "float32", max_gap=0.3).max_gap == 0.3


# ---- grpokit vllm-serve ----------------------------------------------------------------------------------------
def test_vllm_serve_adds_the_flags_grpokit_needs_unless_given():
    argv, env = vllm_serve_command("m", ["--port", "9001"], "cpu")
    assert argv[:6] == [sys.executable, "-m", "grpokit.commands.vllm_serve", "serve", "m", "--port"]
    flags = dict(zip(argv[7::2], argv[8::2]))
    assert flags == {
        "--middleware": "grpokit.rollout.vllm.serve_auth.KeyedRoutes",  # the key on every route
        "--host": "127.0.0.1",
        "--logprobs-mode": "processed_logprobs",
        "--worker-extension-cls": EXTENSION,
    }
    assert env == {"VLLM_SERVER_DEV_MODE": "1"}
    argv, _ = vllm_serve_command("m", ["--host=0.0.0.0"], "cuda")
    assert "127.0.0.1" not in argv and argv[argv.index("--weight-transfer-config") + 1] == '{"backend": "nccl"}'


def test_vllm_serve_without_vllm_is_one_line():
    proc = subprocess.run(
        [sys.executable, "-m", "grpokit.cli", "vllm-serve", "m"], capture_output=True, text=True, timeout=120
    )
    if proc.returncode != 2:  # an environment with vLLM would have started a server
        pytest.skip("vllm is installed here")
    assert proc.stderr.strip().count("\n") == 0 and "pip install vllm" in proc.stderr


# ---- a training run through the CLI ------------------------------------------------------------------------------
def cli_train(tmp_path, model_dir, url: str, **overrides) -> subprocess.CompletedProcess:
    tmp_path.mkdir(exist_ok=True)
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"w{i} w{i + 1}", "target": "w7"}) + "\n" for i in range(8)))
    reward = os.path.join(os.path.dirname(__file__), "..", "integration", "rewards_for_tests.py")
    cfg = dict(model_name_or_path=str(model_dir), train_dataset=str(data), output_dir=str(tmp_path / "run"),
               engine="vllm", vllm_mode="server", vllm_server_base_url=url, vllm_server_timeout=2, device="cpu",
               num_generations=2, per_device_train_batch_size=4, max_steps=2, max_completion_length=4,
               progress_bar=False, report_to=["jsonl"], save_steps=0, rewards=[f"{reward}:target_fraction"],
               **overrides)  # fmt: skip
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    return subprocess.run(
        [sys.executable, "-m", "grpokit.cli", "train", str(path)], env=env, capture_output=True, text=True,
        timeout=600,  # a bound for a 2-core machine; the runs fail within seconds
    )  # fmt: skip


def test_a_run_against_no_server_ends_with_one_line(tmp_path, tiny_model_dir):
    url = f"http://127.0.0.1:{free_port()}"
    proc = cli_train(tmp_path, tiny_model_dir, url)
    assert proc.returncode == 2, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"grpokit: error: vLLM server {url}: /health not ready within 2 s"), proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr


def test_a_server_hanging_mid_run_ends_it_with_one_line(tmp_path, tiny_model_dir):
    with FakeVLLM() as fake:
        fake.hang.add("/v1/completions")
        proc = cli_train(tmp_path, tiny_model_dir, fake.url)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert f"vLLM server {fake.url}: /v1/completions did not answer within 2 s" in last


def test_log_probs_that_are_not_the_learners_stop_the_run_at_step_1(tmp_path, tiny_model_dir):
    """The fake samples with no model at all (log-prob -0.5 for every token): a sync that never arrived."""
    with FakeVLLM() as fake:
        proc = cli_train(tmp_path, tiny_model_dir, fake.url)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"grpokit: error: step 1: vLLM server {fake.url} samples with other weights"), last
    assert "vllm_max_logprob_gap=0.0001" in last
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines if "loss" in json.loads(line)] == [1]  # logged, then stopped


def test_a_keyless_run_finds_the_key_file_and_a_wrong_key_ends_the_run_in_one_line(tmp_path, tiny_model_dir):
    """Through the CLI against a keyed fake: the key from the loopback key file with no setting (the run reaches
    step 1, where the fake's log-probs stop it), and a wrong key in the config (one line at the first request)."""
    with FakeVLLM(key="the-servers-key") as fake:
        write_key(key_path(int(fake.url.rsplit(":", 1)[1])), "the-servers-key")
        filed = cli_train(tmp_path / "filed", tiny_model_dir, fake.url)
        wrong = cli_train(tmp_path / "wrong", tiny_model_dir, fake.url, vllm_server_api_key="not-the-key")
    last = filed.stderr.strip().splitlines()[-1]
    assert last.startswith(f"grpokit: error: step 1: vLLM server {fake.url} samples with other weights"), last
    assert wrong.returncode == 2 and "Traceback" not in wrong.stderr, wrong.stderr[-3000:]
    last = wrong.stderr.strip().splitlines()[-1]
    assert last.startswith(f"grpokit: error: vLLM server {fake.url}: /v1/models answered HTTP 401: the key sent "
                           "(vllm_server_api_key) is not its key; set vllm_server_api_key"), last  # fmt: skip
    assert "not-the-key" not in wrong.stderr


def test_a_push_folder_left_by_a_killed_learner_is_removed_by_the_next_engine(tmp_path):
    """kill -9 mid-push leaves a model's size of safetensors in /dev/shm: the next push engine removes the folders of
    learners no longer running, and leaves a running learner's and anything not grpokit's."""
    import subprocess
    import sys

    from grpokit.rollout.vllm.server_weights import PREFIX, sweep_dead_pushes

    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()  # its pid is now free: a learner that was killed
    dead, alive = tmp_path / f"{PREFIX}{child.pid}-v3-abc", tmp_path / f"{PREFIX}{os.getpid()}-v1-def"
    other = tmp_path / "grpokit-weights-v2-old"
    for folder in (dead, alive, other):
        folder.mkdir()
        (folder / "model.safetensors").write_bytes(b"x")
    assert sweep_dead_pushes(str(tmp_path)) == [str(dead)]
    assert not dead.exists() and alive.exists() and other.exists()
