"""A normal `grpokit train` prints the run, not third-party noise (grpokit/system/quiet.py): no bitsandbytes line about
a hub kernel ("Failed to load CPU gemm_4bit_forward from kernels-community", logged on CPUs with AVX512-BF16 whenever
peft imports bitsandbytes), no transformers deprecation warnings (``past_key_values`` is passed as ``cache`` where
transformers has it: tests/unit/test_hf_cache.py)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import warnings

import pytest
from shared_helpers import tiny_run_config

pytestmark = pytest.mark.usefixtures("one_thread")

NOISE = ("gemm_4bit_forward", "kernels-community", "is deprecated", "FutureWarning", "DeprecationWarning")


def test_a_cli_run_prints_no_third_party_noise(tmp_path, tiny_model_dir, word_prompts):
    console = {"report_to": ["console"], "progress_bar": True, "save_steps": 0}
    tiny_run_config(tmp_path, tiny_model_dir, max_steps=1, prompts=word_prompts[:8], run=console).rename(
        tmp_path / "config.yaml"
    )
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
