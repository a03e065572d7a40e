"""Helpers of the fault tests: a run config on the tiny model, `grpokit` in a subprocess, the check that a failure is
one line without a traceback, and a snapshot of a run folder's files."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import yaml
from conftest import WORDS

REWARDS = Path(__file__).with_name("rewards_for_faults.py")
GATED, WRONG_LENGTH = f"{REWARDS}:gated", f"{REWARDS}:wrong_length"
G, PROMPTS_PER_STEP = 4, 2
EVAL = ["eval_dataset={data}", "eval_steps=1", "max_eval_prompts=2", "num_generations_eval=2", "pass_at_k=[1]"]


def write_config(tmp_path: Path, model_dir: Path, max_steps: int = 2, **run) -> Path:
    """tmp_path/config.yaml: the tiny model, 20 prompts, the `gated` reward, a checkpoint every step, constant
    learning rate (a resume with a larger max_steps trains as a longer run would); the run folder is tmp_path/run."""
    data = tmp_path / "train.jsonl"
    data.write_text(
        "".join(json.dumps({"prompt": " ".join(WORDS[i : i + 4]), "target": "w7"}) + "\n" for i in range(20))
    )
    config = {
        "model": {"model_name_or_path": str(model_dir)},
        "data": {"train_dataset": str(data)},
        "algo": {"num_generations": G, "beta": 0.04},
        "generation": {"max_completion_length": 4},
        "optim": {
            "learning_rate": 1e-3,
            "lr_scheduler_type": "constant",
            "per_device_train_batch_size": G * PROMPTS_PER_STEP,
            "max_steps": max_steps,
        },
        "run": {
            "output_dir": str(tmp_path / "run"),
            "save_steps": 1,
            "save_total_limit": 2,
            "progress_bar": False,
            "report_to": ["jsonl"],
            **run,
        },
        "rewards": [GATED],
        "reward": {"reward_timeout": 600},  # the gate holds the first call while a test acts
    }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def cli_env(**extra: str) -> dict:
    return dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", **extra)


def grpokit(*args: str, env: dict | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    """`grpokit ARGS` in a subprocess (stdout and stderr captured as text)."""
    return subprocess.run(
        [sys.executable, "-m", "grpokit.cli", *map(str, args)],
        env=env or cli_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def grpokit_lines(stderr: str) -> list[str]:
    """grpokit's own lines on stderr (other libraries' progress bars and warnings left out)."""
    return [line for line in stderr.splitlines() if line.startswith("grpokit:")]


def one_line(proc: subprocess.CompletedProcess, code: int) -> str:
    """Exit ``code``, no traceback, exactly one line from grpokit on stderr; returns that line."""
    assert proc.returncode == code, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    lines = grpokit_lines(proc.stderr)
    assert len(lines) == 1, proc.stderr[-3000:]
    return lines[0]


def snapshot(run: Path) -> dict[str, str]:
    """Every file of a run folder (relative path -> SHA-256), the lock file left out (it names the last writer)."""
    return {
        p.relative_to(run).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(run.rglob("*"))
        if p.is_file() and p.name != ".grpokit.lock"
    }
