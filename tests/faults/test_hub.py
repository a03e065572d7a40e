"""A hub model that cannot be reached fails within seconds, with a message that is right about HF_HUB_OFFLINE.

The hub is made unreachable on any machine by pointing HF_ENDPOINT at this machine: a closed port (refused at
once) or a port that accepts and never answers (the probe's timeout). Without grpokit's probe, huggingface_hub
retried each file five times with backoff (a `grpokit train` of a hub id took 100 s here before failing), saying
"Retrying in ..." on stderr each time: the tests check that no request was retried, and bound each run with a
subprocess timeout (no duration is asserted). docs/reliability.md lists these promises."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from shared_helpers import tiny_run_config

from .conftest import one_line

HUB_ID = "nosuchorg/nosuchmodel"
BOUND_SECONDS = 120  # imports and start-up included; the retries alone took minutes


def config(tmp_path: Path, model: str) -> Path:
    prompts = [{"prompt": "w1 w2", "target": "w7"}] * 4
    return tiny_run_config(tmp_path, model, max_steps=1, num_generations=2, prompts=prompts)


def hub_env(endpoint: str | None, offline: bool, home: Path) -> dict:
    """The environment with HF_HUB_OFFLINE set or unset, HF_ENDPOINT at ``endpoint``, and an empty cache."""
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_ENDPOINT")}
    env.update(HF_HOME=str(home), TOKENIZERS_PARALLELISM="false")
    if offline:
        env["HF_HUB_OFFLINE"] = "1"
    if endpoint:
        env["HF_ENDPOINT"] = endpoint
    return env


def run(args: list, env: dict, cwd: Path) -> subprocess.CompletedProcess:
    """`python -m grpokit ARGS`; no hub request was retried (huggingface_hub says "Retrying in" on each retry)."""
    proc = subprocess.run(
        [sys.executable, "-m", "grpokit", *map(str, args)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=BOUND_SECONDS,
        check=False,
    )
    assert "Retrying in" not in proc.stderr, proc.stderr[-3000:]
    return proc


@pytest.fixture()
def closed_port():
    """A local port nothing listens on (connections are refused at once)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


@pytest.fixture()
def silent_port():
    """A local port that accepts connections (the kernel's backlog) and never answers."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(64)
    yield f"http://127.0.0.1:{s.getsockname()[1]}"
    s.close()


def test_offline_and_not_cached(tmp_path):
    """HF_HUB_OFFLINE=1: the message says so (not "couldn't connect") and how to get the model."""
    proc = run(["train", config(tmp_path, HUB_ID)], hub_env(None, True, tmp_path / "hf"), tmp_path)
    line = one_line(proc, 2)
    assert line.startswith(f"grpokit: error: cannot load the model '{HUB_ID}'; HF_HUB_OFFLINE is set, so")
    assert "connect" not in line and line.endswith("unset HF_HUB_OFFLINE to download it, or give a local folder.")


@pytest.mark.parametrize("endpoint", ["closed_port", "silent_port"])
def test_hub_out_of_reach_and_not_cached(tmp_path, request, endpoint):
    """HF_HUB_OFFLINE unset, the hub refusing or silent: the message names the hub and why it cannot be reached,
    and does not blame HF_HUB_OFFLINE."""
    url = request.getfixturevalue(endpoint)
    proc = run(["train", config(tmp_path, HUB_ID)], hub_env(url, False, tmp_path / "hf"), tmp_path)
    line = one_line(proc, 2)
    assert line.startswith(f"grpokit: error: cannot load the model '{HUB_ID}'; the hub ({url}) cannot be reached (")
    assert "HF_HUB_OFFLINE" not in line and "not in the local cache" in line


def test_hub_out_of_reach_with_the_model_cached(tmp_path, tiny_model_dir, closed_port):
    """The model is in the local cache: it loads from there with one warning that the hub could not be reached."""
    home = tmp_path / "hf"
    snapshot = home / "hub" / "models--nosuchorg--nosuchmodel" / "snapshots" / ("0" * 40)
    snapshot.parent.mkdir(parents=True)
    subprocess.run(["cp", "-r", str(tiny_model_dir), str(snapshot)], check=True)
    (snapshot.parent.parent / "refs").mkdir()
    (snapshot.parent.parent / "refs" / "main").write_text("0" * 40)
    proc = run(["explain", config(tmp_path, HUB_ID)], hub_env(closed_port, False, home), tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    assert f"the hub ({closed_port}) cannot be reached" in proc.stderr
    assert f"loaded the model config '{HUB_ID}' from the local cache" in proc.stderr
    assert "parameters" in proc.stdout
