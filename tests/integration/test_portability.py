"""Training runs on a CPU without native bf16, AVX-512 or AMX, simulated on whatever CPU runs the tests.

The simulation, in a subprocess: ``ATEN_CPU_CAPABILITY=avx2`` (torch's own kernels use AVX2 at most),
``ONEDNN_MAX_CPU_ISA=AVX2`` (oneDNN too: its bf16 support check fails and its weight-packing op raises
"bf16 path needs the cpu support ...", exactly as on an AVX2-only Zen 3) and ``GRPOKIT_CPU_CAPS=avx2``
(grpokit's probe sees only AVX2, whatever /proc/cpuinfo says).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from test_train import write_config

AVX2_ONLY = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "GRPOKIT_CPU_CAPS": "avx2"}


def run_simulated(args: list[str], cwd) -> subprocess.CompletedProcess:
    env = {**os.environ, **AVX2_ONLY, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_the_simulation_has_no_bf16_kernels(tmp_path):
    probe = run_simulated(
        [
            "-c",
            "import torch; from grpokit.machine.cpu_caps import cpu_caps; c = cpu_caps(); "
            "print(torch.backends.cpu.get_cpu_capability(), "
            "torch.ops.mkldnn._is_mkldnn_bf16_supported(), "
            "c.avx512, c.native_bf16, c.packs(torch.bfloat16))",
        ],
        tmp_path,
    )
    assert probe.returncode == 0, probe.stderr
    assert probe.stdout.split() == ["AVX2", "False", "False", "False", "False"]


@pytest.mark.parametrize("dtype", ["bfloat16", "auto"])
def test_a_training_step_on_an_avx2_only_cpu(dtype, tmp_path, tiny_model_dir, word_prompts):
    """dtype=bfloat16 (bf16 weights: the fused decoder's bf16 weights cannot be packed here) trains and says
    once why it is slow; dtype=auto picks float32 and says nothing."""
    config = write_config(tmp_path, tiny_model_dir, word_prompts)
    result = run_simulated(["-m", "grpokit", "train", str(config), "max_steps=1", f"dtype={dtype}"], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines if "loss" in m] == [1]
    assert all(isinstance(m["loss"], float) and m["loss"] == m["loss"] for m in lines if "loss" in m)  # finite, not NaN
    assert "cannot pack" not in result.stderr  # the probe kept the packing op from being tried
    slow = result.stderr.count("dtype=bfloat16 on a CPU without native bf16 matmul")
    assert slow == (1 if dtype == "bfloat16" else 0), result.stderr[-3000:]


def test_the_fast_path_tests_pass_on_an_avx2_only_cpu(tmp_path):
    """The unit tests of every CPU fast path (packed linears, fused decoder, sampling with the KV cache under
    bf16 autocast, fused head, attention, the bf16 learner, multi-turn KV continuation) on the simulated CPU:
    they pass, or skip naming the instruction set they need."""
    unit = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "unit")
    names = ("kernels", "packed_linear", "fused_decoder", "engine", "attention", "perf_paths", "multiturn")
    files = [os.path.join(unit, f"test_{name}.py") for name in names]
    result = run_simulated(["-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", *files], tmp_path)
    assert result.returncode == 0, result.stdout[-4000:]
    skips = [line for line in result.stdout.splitlines() if line.startswith("SKIPPED")]
    assert skips and all("AVX512BW + AVX512VL + AVX512DQ" in line for line in skips), skips
