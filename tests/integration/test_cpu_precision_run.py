"""`grpokit train` with mixed_precision auto on a CPU takes the measured choice (here: rates written into the probe's
cache beforehand, so nothing depends on this machine's timings) and records it in config.yaml; `grpokit explain`
prints it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from shared_helpers import tiny_run_config, word_prompts

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
    tiny_run_config(
        tmp_path,
        tmp_path / "model",
        max_steps=1,
        prompts=word_prompts(8, 2),
        generation={"max_completion_length": 3},
        run={"progress_bar": True, "save_steps": 0},
    ).rename(tmp_path / "config.yaml")
    env = {**os.environ, "GRPOKIT_CACHE": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"}
    for forced in ("GRPOKIT_CPU_CAPS", "GRPOKIT_CPU_PRECISION", "ONEDNN_MAX_CPU_ISA"):
        env.pop(forced, None)
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


PROBE = """
from grpokit.kernels.cpu_precision import cpu_choice
from grpokit.kernels.cpu_probe import Shape
choice = cpu_choice([Shape(512, 1408, 16), Shape(1408, 512, 8), Shape(512, 32000)], probe=True)
print(choice.learning.compute, choice.sampling.compute, choice.source.split(",")[0], sep="|")
print(choice.learning.reason)
"""


def test_the_real_probe_picks_float32_where_bf16_matmuls_are_not_native(tmp_path):
    """The real probe (nothing injected) in a process whose oneDNN is capped at AVX512_CORE: the CPU's flags still
    say AVX512-BF16 (and AMX here), but oneDNN runs bf16 without them, converting. The flag rule would take bf16; the
    probe measures it slower and keeps float32. The margin is wide, not a close timing: 23-26 GFLOP/s in bf16 against
    112-125 in float32 for learning on this project's Intel Xeon VM (docs/performance.md). On a CPU without AVX-512,
    oneDNN has no bf16 path at all and float32 is the only candidate (not measured): float32 too."""
    env = {**os.environ, "GRPOKIT_CACHE": str(tmp_path), "ONEDNN_MAX_CPU_ISA": "AVX512_CORE", "OMP_NUM_THREADS": "1"}
    for forced in ("GRPOKIT_CPU_CAPS", "GRPOKIT_CPU_PRECISION"):
        env.pop(forced, None)
    result = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-4000:]
    choice, reason = result.stdout.strip().splitlines()
    learning, _, source = choice.split("|")
    assert learning == "float32", result.stdout
    if source.startswith("measured"):  # bf16 was a candidate and timed: the reason names both rates
        assert reason.startswith("bf16 ") and reason.endswith(": float32"), reason
    else:
        assert source == "not measured" and "the only path here" in reason, result.stdout
