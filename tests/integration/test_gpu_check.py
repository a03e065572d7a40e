"""scripts/gpu_check.py --dry-run on the CPU: every part runs (or says which package it misses) and the JSON holds
the figures; the precision A/B already shows, on a CPU, what bf16 weights lose."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu_check.py"


def test_the_dry_run_runs_every_part_on_the_cpu(tmp_path):
    out = tmp_path / "dry.json"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--dry-run", "--out", str(out)],
        capture_output=True,
        text=True,
        env=env,
        timeout=1200,  # generous: five fresh interpreters import torch on a busy machine; each part has its own limit
    )
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    report = json.loads(out.read_text())
    parts = report["parts"]
    assert report["dry_run"] is True and list(parts) == ["precision", "collectives", "train_hf", "train_vllm", "vllm"]
    ab = parts["precision"]
    assert ab["status"] == "ok"
    assert ab["fp32_autocast"]["weights_dtype"] == "float32" and ab["fp32_autocast"]["moment_dtypes"] == ["float32"]
    assert ab["fp32_autocast"]["fraction_changed"] > 0.99
    assert ab["bf16_weights"]["fraction_changed"] < 0.5  # lr 1e-6 is below most bf16 weights' rounding
    assert parts["collectives"]["status"] == "ok" and parts["collectives"]["backend"] == "cpu:gloo,cuda:gloo"
    assert {"gather/cpu", "sum/cpu", "gather_ragged/cpu", "mean_metrics/cpu-float64"} <= set(
        parts["collectives"]["ran"]
    )
    hf = parts["train_hf"]
    assert hf["status"] == "ok" and hf["steps"] == 2 and hf["weights_dtype"] == "float32"
    try:
        import vllm  # noqa: F401
    except ImportError:
        assert parts["train_vllm"] == parts["train_vllm"] | {"status": "missing", "package": "vllm"}
        assert parts["vllm"]["status"] == "missing" and "vllm is not installed" in parts["vllm"]["reason"]
    else:
        assert parts["train_vllm"]["status"] == "ok", parts["train_vllm"]  # vLLM's CPU build trains the dry run


def test_without_a_gpu_the_real_check_refuses_and_says_why(tmp_path):
    pytest.importorskip("torch")
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is visible: the real check would run")
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(tmp_path / "x.json")], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 2 and "no CUDA GPU visible" in result.stderr
