"""The vLLM server's key (grpokit/rollout/vllm/keys.py, vllm_serve_auth.py, vllm_serve.py): the key file (0600
in a 0700 folder, written whole, found by a trainer for a loopback URL only), the ASGI middleware that requires the
key on every route but /health, ``grpokit vllm-serve``'s key handling (made when none is given, taken out of the
command line, a non-loopback host refused without one), and the NCCL rendezvous address. The client's side against
the fake server: tests/unit/test_vllm_server_client.py; the real server: tests/real_vllm/test_server_vllm.py."""

from __future__ import annotations

import asyncio
import os
import socket
import stat
import subprocess
import sys

import pytest

from grpokit.commands.vllm_serve import MIDDLEWARE, server_key, take_api_key
from grpokit.errors import ConfigError
from grpokit.rollout.vllm.keys import client_key, is_loopback, key_dir, key_path, read_key, write_key
from grpokit.rollout.vllm.serve_auth import KeyedRoutes


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


# ---- the key file --------------------------------------------------------------------------------------------------
def test_the_key_file_is_private_and_written_whole(tmp_path):
    env = {"XDG_RUNTIME_DIR": str(tmp_path)}
    path = key_path(8123, env)
    assert path == tmp_path / "grpokit" / "vllm-keys" / "loopback-8123"
    old = os.umask(0)  # the most permissive umask: the modes must not come from it
    try:
        write_key(path, "first")
        write_key(path, "second")  # a restarted server on the same port replaces the key
    finally:
        os.umask(old)
    assert mode(path) == 0o600 and mode(path.parent) == 0o700
    assert read_key(path) == "second" and os.listdir(path.parent) == ["loopback-8123"]  # no temporary file left


def test_an_existing_folder_is_made_private_and_a_readable_file_is_not_a_key(tmp_path):
    folder = tmp_path / "grpokit" / "vllm-keys"
    folder.mkdir(parents=True, mode=0o755)
    os.chmod(folder, 0o755)
    path = write_key(folder / "loopback-1", "k")
    assert mode(folder) == 0o700
    os.chmod(path, 0o644)  # readable by others: not a file this user's server wrote
    assert read_key(path) is None
    os.chmod(path, 0o600)
    link = folder / "loopback-2"
    link.symlink_to(path)
    assert read_key(link) is None and read_key(folder / "loopback-3") is None  # a link, a missing file


def test_without_xdg_runtime_dir_the_keys_go_under_the_users_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    assert key_dir({}) == tmp_path / ".cache" / "grpokit" / "vllm-keys"
    assert key_dir({"XDG_RUNTIME_DIR": str(tmp_path / "missing")}) == tmp_path / ".cache" / "grpokit" / "vllm-keys"


def test_a_trainer_finds_the_key_for_a_loopback_url_only(tmp_path):
    env = {"XDG_RUNTIME_DIR": str(tmp_path)}
    write_key(key_path(8200, env), "filed")
    assert client_key("given", "http://127.0.0.1:8200", env) == ("given", "vllm_server_api_key")
    from_env = client_key(None, "http://127.0.0.1:8200", {**env, "VLLM_API_KEY": "from-env"})
    assert from_env == ("from-env", "VLLM_API_KEY")
    # any loopback name, and 0.0.0.0 (TRL's default vllm_server_host: Linux connects it to this machine)
    for url in ("http://127.0.0.1:8200", "http://localhost:8200/", "http://[::1]:8200", "http://0.0.0.0:8200"):
        key, source = client_key(None, url, env)
        assert key == "filed" and str(key_path(8200, env)) in source, url
    key, source = client_key(None, "http://127.0.0.1:8201", env)  # another port: another server
    assert key is None and "loopback-8201" in source
    key, source = client_key(None, "http://10.0.0.5:8200", env)  # another machine's server: never the file
    assert key is None and "loopback URLs only" in source
    assert [is_loopback(h) for h in ("127.0.0.2", "::1", "[::1]", "localhost", "0.0.0.0", "10.1.1.1", "", None)] == [
        True, True, True, True, False, False, False, False]  # fmt: skip


def test_the_key_is_never_in_the_saved_config():
    """config.yaml, the trackers, `grpokit explain` and a repr all read to_dict(): the key is null there."""
    from grpokit import GRPOConfig

    args = GRPOConfig(engine="vllm", vllm_mode="server", vllm_server_api_key="hush-123")
    assert args.vllm_server_api_key == "hush-123" and args.replace(max_steps=3).vllm_server_api_key == "hush-123"
    assert args.to_dict()["generation"]["vllm_server_api_key"] is None
    assert "hush-123" not in args.to_yaml() + repr(args)


# ---- the middleware ------------------------------------------------------------------------------------------------
def call(key, path, method="POST", headers=(), kind="http"):
    """One request through KeyedRoutes with ``key``: (the status it answered, or the close code of a WebSocket;
    whether the app behind it ran)."""
    ran, sent = [], []

    async def app(scope, receive, send):
        ran.append(scope["path"])
        await send({"type": "http.response.start", "status": 200, "headers": []})

    async def send(message):
        sent.append(message)

    scope = {"type": kind, "path": path, "method": method, "headers": list(headers), "root_path": ""}
    asyncio.run(KeyedRoutes(app, key=key)(scope, None, send))
    return sent[0].get("status") or sent[0].get("code"), bool(ran)


def test_every_route_but_health_needs_the_key():
    key, good = "s3cret", [(b"authorization", b"Bearer s3cret")]
    routes = ("/collective_rpc", "/init_weight_transfer_engine", "/update_weights", "/reset_prefix_cache",
              "/server_info", "/v1/completions", "/v1/models", "/metrics", "/openapi.json", "/")  # fmt: skip
    for route in routes:
        assert call(key, route) == (401, False), route
        assert call(key, route, headers=[(b"authorization", b"Bearer wrong")]) == (401, False), route
        assert call(key, route, headers=[(b"authorization", b"s3cret")]) == (401, False), route  # not Bearer
        assert call(key, route, headers=good) == (200, True), route
    assert call(key, "/health", method="GET") == (200, True)
    assert call(key, "/health", method="POST") == (401, False)  # only the liveness probe is open
    assert call(key, "/collective_rpc", method="OPTIONS") == (401, False)
    assert call(key, "/v1/realtime", kind="websocket") == (1008, False)  # closed before it is accepted
    assert call(key, "/x", headers=[(b"Authorization", b"bearer s3cret")]) == (200, True)  # names are any case


def test_the_middleware_without_a_key_does_not_start(monkeypatch):
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    with pytest.raises(RuntimeError, match="VLLM_API_KEY"):
        KeyedRoutes(lambda *a: None)
    monkeypatch.setenv("VLLM_API_KEY", "from-env")
    assert call_env("/collective_rpc", b"Bearer from-env") == 200


def call_env(path, authorization) -> int:
    sent = []

    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "path": path, "method": "POST", "headers": [(b"authorization", authorization)]}
    asyncio.run(KeyedRoutes(app)(scope, None, send))
    return sent[0]["status"]


# ---- grpokit vllm-serve's key -----------------------------------------------------------------------------------
def test_a_given_key_leaves_the_command_line_and_none_given_makes_one():
    assert take_api_key(["--port", "1", "--api-key", "k", "--dtype", "float32"]) == (
        ["--port", "1", "--dtype", "float32"], "k")  # fmt: skip
    assert take_api_key(["--api_key=-k"]) == ([], "-k")
    for bad in (["--api-key", "a", "--api-key", "b"], ["--api-key"], ["--api-key="]):
        with pytest.raises(ConfigError, match="one key"):
            take_api_key(bad)
    args, key, made = server_key(["--port", "9"], {})
    assert args == ["--port", "9"] and made and len(key) == 43  # secrets.token_urlsafe(32)
    assert server_key(["--port", "9"], {})[1] != key  # a fresh key each start
    assert server_key(["--host", "0.0.0.0", "--api-key", "k"], {}) == (["--host", "0.0.0.0"], "k", False)
    assert server_key(["--host=10.0.0.1"], {"VLLM_API_KEY": "e"}) == (["--host=10.0.0.1"], "e", False)


def test_a_host_other_than_loopback_without_a_key_is_refused_naming_api_key():
    for args in (["--host", "0.0.0.0"], ["--host=10.0.0.1"], ["--host", "myhost.example"]):
        with pytest.raises(ConfigError, match="--api-key") as refused:
            server_key(args, {})
        assert "\n" not in str(refused.value)
    env = {k: v for k, v in os.environ.items() if k != "VLLM_API_KEY"}
    proc = subprocess.run([sys.executable, "-m", "grpokit.cli", "vllm-serve", "m", "--host", "0.0.0.0"], env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0, proc.stderr
    assert proc.stderr.startswith("grpokit: error: grpokit vllm-serve --host 0.0.0.0") and "--api-key" in proc.stderr
    assert MIDDLEWARE == "grpokit.rollout.vllm.serve_auth.KeyedRoutes"


# ---- the NCCL rendezvous -------------------------------------------------------------------------------------------
def test_the_rendezvous_binds_the_address_that_faces_the_server():
    from grpokit.rollout.vllm.http import VLLMServerError
    from grpokit.rollout.vllm.server_weights import rendezvous_address, route_source

    for url in ("http://127.0.0.1:8000", "http://localhost:8000", "http://[::1]:8000", "http://0.0.0.0:8000"):
        assert rendezvous_address(url, route=None) == "127.0.0.1", url  # the route is not even asked
    asked = []
    found = rendezvous_address("http://gpu-box:9000", route=lambda h, p: asked.append((h, p)) or "10.2.3.4")
    assert found == "10.2.3.4"
    assert asked == [("gpu-box", 9000)]
    for route in (lambda h, p: "0.0.0.0", lambda h, p: (_ for _ in ()).throw(socket.gaierror("no such host"))):
        with pytest.raises(VLLMServerError, match="no IPv4 address of this machine faces gpu-box") as none:
            rendezvous_address("http://gpu-box:9000", route=route)
        assert "\n" not in str(none.value)
    # the real route: to this machine's own outward address (if it has a route out), which is that address itself,
    # an address one can bind (what vLLM's StatelessProcessGroup does with it)
    try:
        own = route_source("192.0.2.1", 80)  # TEST-NET-1: never reached, only routed
    except OSError:
        pytest.skip("this machine has no IPv4 route out, so no own non-loopback address to route to")
    assert rendezvous_address(f"http://{own}:8000") == own and own != "0.0.0.0"
    with socket.socket() as s:
        s.bind((own, 0))
