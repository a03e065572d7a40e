"""What the real-vLLM tests share: the run settings, the prompts, the CLI's run and the metrics' reading."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

TESTS = Path(__file__).resolve().parents[1]
TARGET_REWARD = f"{TESTS / 'integration' / 'rewards_for_tests.py'}:target_fraction"
WORDS = [f"w{i}" for i in range(40)]
GAP_FP32 = 1e-5  # |learner - vLLM| log-prob per sampled token after every sync, float32 on both sides
# float32 runs: the learner's weights in float32 (no autocast: the tiny model is far below its threshold)
SETTINGS = dict(
    engine="vllm",
    device="cpu",
    num_generations=4,
    per_device_train_batch_size=8,
    max_steps=2,
    max_completion_length=8,
    learning_rate=1e-2,
    beta=0.04,
    temperature=1.0,
    vllm_kv_cache_gib=0.25,
    progress_bar=False,
    report_to=["jsonl"],
    save_steps=0,
)


def prompts() -> list[dict]:
    return [{"prompt": " ".join(WORDS[i : i + 4]), "target": "w7"} for i in range(20)]


def metrics(run: Path) -> list[dict]:
    """The training steps' lines of a run's metrics.jsonl (evaluation lines have no loss)."""
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [line for line in lines if "loss" in line]


def all_metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def cli_train(tmp_path: Path, model_dir: Path, run: Path, **overrides) -> subprocess.CompletedProcess:
    """``grpokit train cfg.yaml`` in a subprocess (the installed command's path), from a YAML of SETTINGS."""
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in prompts()))
    values = {**SETTINGS, "model_name_or_path": str(model_dir), "train_dataset": str(data), "output_dir": str(run)}
    values.update(overrides)
    cfg = tmp_path / f"{run.name}.yaml"
    cfg.write_text(yaml.safe_dump({**values, "rewards": [TARGET_REWARD]}))
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    proc = subprocess.run(
        [sys.executable, "-m", "grpokit.cli", "train", str(cfg)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,  # a generous bound on a 2-core CI machine; a run takes ~30 s
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return proc


def check_token_versions(run: Path, steps: list[dict], K: int, S: int) -> None:
    """Partial rollouts after ``S`` tokens with max_staleness ``K``: each stored completion of step b (batch admitted
    with version v = max(0, b - 1 - K)) has tokens [0, S) by v and tokens from S on by w = min(v + 1, b - 1)
    (grpokit/rollout/partial.py: none for batch 1), stored as the pieces [[0, v], [S, w]]; so a step's mean
    token staleness is below its policy_staleness once completions are continued (``steps``: its metrics lines)."""
    import sqlite3

    with sqlite3.connect(run / "rollouts.sqlite") as db:
        rows = db.execute("SELECT step, policy_version, completion_tokens, token_versions FROM rollouts").fetchall()
    two = 0
    for step, version, n, runs in rows:
        assert version == max(0, step - 1 - K), (step, version)
        switch = min(version + 1, step - 1)
        if n > S and switch > version:
            assert json.loads(runs) == [[0, version], [S, switch]], (step, n, runs)
            two += 1
        else:
            assert runs is None, (step, n, runs)
    assert two >= len(rows) // 2, f"only {two} of {len(rows)} completions were longer than {S} tokens"
    for line in steps[1:]:
        assert line["policy_staleness_token_mean"] < line["policy_staleness"], line
    assert steps[0]["policy_staleness_token_mean"] == steps[0]["policy_staleness"] == 0
