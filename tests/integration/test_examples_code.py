"""examples/code in CI: the task built here (its stand-in data is the real data: generated, no download), a
shorter warm start and GRPO run through the same code as the README's command, and held-out pass@1 rising."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from grpokit.demo.warmstart import WarmStartConfig
from grpokit.rewards import sandbox
from grpokit.store import RolloutStore
from grpokit.store.report import report_page

EXAMPLE = Path(__file__).parents[2] / "examples" / "code" / "run.py"


def _load():
    spec = importlib.util.spec_from_file_location("example_code_run", EXAMPLE)
    module = sys.modules[spec.name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_code_example_learns(tmp_path):
    assert any(sandbox._works(b, sandbox.os.geteuid() == 0) is None for b in ("bwrap", "unshare")), (
        "no sandbox works on this machine: install bubblewrap (make test does, as root)"
    )
    example = _load()
    # A weak teacher (right 10 % of the time) fixes the start low on every CPU: with the example's 0.3 the warm start
    # began at held-out pass@1 0.22 on the AMD machine it was written on but 0.39 on an Intel AVX-512/AMX one (its
    # matmuls round differently), leaving 16 steps too little room (0.39 -> 0.42).
    config = WarmStartConfig(clean_steps=400, sloppy_steps=150, batch_size=64, teacher_accuracy=0.1)
    example.build(tmp_path, config, log=lambda line: None)
    result = example.train(
        tmp_path,
        steps=16,
        overrides=["per_device_train_batch_size=32", "eval_steps=16", "num_generations_eval=2", "pass_at_k=[1,2]"],
    )
    before, after = result["before"], result["after"]
    print(f"held-out pass@1 {before:.3f} -> {after:.3f}")
    assert after >= before + 0.15, result["evals"]  # measured on the Intel AVX-512/AMX machine: 0.16 -> 0.48 (seed 0)
    # the per-test results are stored with each rollout and shown in the report
    with RolloutStore(tmp_path / "run", readonly=True) as store:
        rows = store.rollouts()
    assert all(len(r["extra"]["code_tests"]) == 2 for r in rows)
    assert {t for r in rows for t in r["extra"]["code_tests"]} >= {"passed", "failed"}
    assert "code_tests: [&quot;passed&quot;, &quot;passed&quot;]" in report_page(tmp_path / "run")
