"""An existing Ray cluster (`ray start --head`) joined with `distributed.address: auto`, through the CLI."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from shared_helpers import RAY_WORKERS, tiny_run_config

from grpokit.store import RolloutStore

pytest.importorskip("ray", reason="Ray tests need the ray extra: pip install 'grpokit[ray]'")
# alone: `ray stop --force` ends every Ray cluster on the machine, and `address: auto` joins whichever started last
pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.alone]

RAY = str(Path(sys.executable).with_name("ray"))


def write_config(tmp_path: Path, model_dir: Path, prompts: list[dict]) -> Path:
    path = tiny_run_config(
        tmp_path,
        model_dir,
        max_steps=2,
        rewards=[{"name": "length", "target_length": 40, "unit": "chars"}],
        prompts=prompts,
        algo={"beta": 0.0},
        generation={"max_completion_length": 8},
        optim={"learning_rate": 1e-2},
        run={"save_steps": 0},
        distributed=RAY_WORKERS | {"address": "auto"},
    )
    return path.rename(tmp_path / "config.yaml")


def train(config: Path, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "grpokit", "train", str(config)], env=env, capture_output=True, text=True, timeout=600
    )


@pytest.fixture()
def ray_env():
    """The environment of `ray start` / `ray stop` and of the run: no inherited RAY_ settings."""
    if not shutil.which(RAY):
        pytest.skip("the `ray` command is not installed next to this Python")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    return env


def test_address_auto_joins_the_cluster_ray_start_made(tmp_path, tiny_model_dir, word_prompts, ray_env):
    config = write_config(tmp_path, tiny_model_dir, word_prompts)
    subprocess.run(
        [RAY, "start", "--head", "--num-cpus", "2", "--include-dashboard", "false"],
        env=ray_env,
        check=True,
        capture_output=True,
        timeout=120,
    )
    try:
        result = train(config, ray_env)
        assert result.returncode == 0, result.stderr[-3000:]
        with RolloutStore(tmp_path / "run" / "rollouts.sqlite", readonly=True) as store:
            rows = store.rollouts()
        assert len(rows) == 2 * 8 and {r["step"] for r in rows} == {1, 2}
        assert [r["policy_version"] for r in rows] == [r["step"] - 1 for r in rows]
    finally:
        subprocess.run([RAY, "stop", "--force"], env=ray_env, capture_output=True, timeout=120)


def test_address_auto_without_a_cluster_is_a_clear_error(tmp_path, tiny_model_dir, word_prompts, ray_env):
    subprocess.run([RAY, "stop", "--force"], env=ray_env, capture_output=True, timeout=120)
    result = train(write_config(tmp_path, tiny_model_dir, word_prompts), ray_env)
    assert result.returncode == 2, result.stderr[-3000:]
    assert "no Ray cluster to join" in result.stderr and "ray start --head" in result.stderr
    assert "Traceback" not in result.stderr
