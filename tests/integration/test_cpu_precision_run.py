"""`grpokit train` with mixed_precision auto on a CPU takes the measured choice (here: rates written into the probe's
cache beforehand, so nothing depends on this machine's timings) and records it in config.yaml; `grpokit explain`
prints it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml
from shared_helpers import TARGET_REWARD

from grpokit.kernels.cpu_precision import cache_key, cache_path
from grpokit.kernels.cpu_probe import LEARN_ROWS, candidates, matmul_shapes
from grpokit.machine.cpu_caps import cpu_caps
from grpokit.system.cached_folders import write_atomic
from grpokit.testing import build_tiny_causal_lm, build_word_tokenizer

pytestmark = pytest.mark.usefixtures("one_thread")
RATES = {"float32": 120.0, "bf16": 77.0, "fp16": 60.0}, {"float32": 100.0, "bf16": 290.0, "fp16": 128.0}


def test_train_records_the_measured_choice(tmp_path):
    words = [f"w{i}" for i in range(40_000)]  # 10.2M embedding parameters: past the 10M floor (no probe under it)
    model, _ = build_tiny_causal_lm(tmp_path / "model", build_word_tokenizer(words), hidden_size=256, num_heads=4)
    key = cache_key(matmul_shapes(model), cpu_caps(), LEARN_ROWS, 8)  # 8 completions per step: the sampling rows
    learning = {path: RATES[0][path] for path in key["learning"]}
    sampling = {path: RATES[1][path] for path in key["sampling"]}
    entry = {"key": key, "rates": {"learning": learning, "sampling": sampling}}
    write_atomic(cache_path(key, tmp_path / "cache"), json.dumps(entry))
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"w{i} w{i + 1}", "target": "w7"}) + "\n" for i in range(8)))
    config = {
        "model": {"model_name_or_path": str(tmp_path / "model")},
        "data": {"train_dataset": str(data)},
        "algo": {"num_generations": 4},
        "generation": {"max_completion_length": 3},
        "optim": {"per_device_train_batch_size": 8, "max_steps": 1},
        "run": {"output_dir": str(tmp_path / "run"), "report_to": ["jsonl"], "save_steps": 0},
        "rewards": [TARGET_REWARD],
    }
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    env = {**os.environ, "GRPOKIT_CACHE": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"}
    env.pop("GRPOKIT_CPU_CAPS", None)
    train = [sys.executable, "-m", "grpokit", "train", "config.yaml"]
    result = subprocess.run(train, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    saved = (tmp_path / "run" / "config.yaml").read_text()
    notes = [line for line in saved.splitlines() if line.startswith("#")]
    if candidates(cpu_caps())[0] == ["float32"]:  # a CPU without oneDNN bf16: float32, nothing to measure
        assert "learning: float32 (float32: the only path here" in "\n".join(notes), saved
    else:
        assert "#   learning: float32 (bf16 77 GFLOP/s < float32 120: float32)" in notes, saved
        assert any(n.startswith("#   sampling: bf16 (") and n.endswith("< bf16 290: bf16)") for n in notes), saved
        cached = "#   rates (GFLOP/s per core): measured, cached in "
        assert any(n.startswith(cached) for n in notes), saved  # the run measured nothing
    assert "mixed_precision: auto" in saved  # the setting itself stays auto: a resumed run measures for itself
    explain = [sys.executable, "-m", "grpokit", "explain", "run"]  # a run folder: its saved config.yaml loads back
    shown = subprocess.run(explain, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert shown.returncode == 0, shown.stderr[-4000:]
    assert "# compute precision" in shown.stdout
    assert next(line for line in notes if "learning:" in line)[2:] in shown.stdout
