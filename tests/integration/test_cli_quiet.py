"""A normal `grpokit train` prints the run, not third-party noise (grpokit/system/quiet.py): no bitsandbytes line about
a hub kernel ("Failed to load CPU gemm_4bit_forward from kernels-community", logged on CPUs with AVX512-BF16 whenever
peft imports bitsandbytes), no transformers deprecation warnings (``past_key_values`` is passed as ``cache`` where
transformers has it: tests/unit/test_hf_cache.py)."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import warnings

import pytest
import yaml
from shared_helpers import TARGET_REWARD

pytestmark = pytest.mark.usefixtures("one_thread")

NOISE = ("gemm_4bit_forward", "kernels-community", "is deprecated", "FutureWarning", "DeprecationWarning")


def test_a_cli_run_prints_no_third_party_noise(tmp_path, tiny_model_dir, word_prompts):
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in word_prompts[:8]))
    config = {
        "model": {"model_name_or_path": str(tiny_model_dir)},
        "data": {"train_dataset": str(data)},
        "algo": {"num_generations": 4},
        "generation": {"max_completion_length": 4},
        "optim": {"per_device_train_batch_size": 8, "max_steps": 1},
        "run": {"output_dir": str(tmp_path / "run"), "report_to": ["console"], "save_steps": 0},
        "rewards": [TARGET_REWARD],
    }
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"} | {"OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "grpokit", "train", "config.yaml"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,  # generous: a fresh interpreter imports torch and transformers on a busy machine
    )
    assert result.returncode == 0, result.stderr[-4000:]
    for noise in NOISE:
        assert noise not in result.stderr + result.stdout, result.stderr
    assert "done: 1 steps" in result.stderr


def test_the_filters_silence_only_the_named_libraries(capsys):
    from grpokit.system.quiet import quiet_third_party

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        quiet_third_party()
        logging.getLogger("bitsandbytes.backends.cpu.ops").warning("Failed to load CPU gemm_4bit_forward")
        warnings.warn_explicit("old API", FutureWarning, "modeling_utils.py", 1, module="transformers.modeling_utils")
        warnings.warn_explicit("mine", FutureWarning, "user.py", 1, module="user_code")
    assert "gemm_4bit_forward" not in capsys.readouterr().err
    assert [str(w.message) for w in caught] == ["mine"]  # a user's own warnings still show
