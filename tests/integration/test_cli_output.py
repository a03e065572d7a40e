"""What `grpokit train` writes when its output is piped (a log file, `| tee`, CI): one line per event, no
transformers loading bars. rich wraps text at 80 columns when stderr is not a terminal; the eval and summary
lines are longer than that."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from shared_helpers import tiny_run_config

pytestmark = pytest.mark.usefixtures("one_thread")


def test_piped_train_log_keeps_one_line_per_event(tmp_path, tiny_model_dir, word_prompts):
    tiny_run_config(
        tmp_path,
        tiny_model_dir,
        max_steps=1,
        prompts=word_prompts[:8],
        data={"eval_dataset": str(tmp_path / "train.jsonl")},
        run={"report_to": ["console"], "progress_bar": True, "save_steps": 0},
        eval={"eval_steps": 1, "num_generations_eval": 2, "pass_at_k": [1, 2]},
    ).rename(tmp_path / "config.yaml")
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "HF_HUB_DISABLE_PROGRESS_BARS")}
    env["OMP_NUM_THREADS"] = "1"
    result = subprocess.run(
        [sys.executable, "-m", "grpokit", "train", "config.yaml"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    lines = result.stderr.splitlines()
    evals = [line for line in lines if line.startswith("eval @ step")]
    assert len(evals) == 2, result.stderr  # before the first step and after the last
    for line in evals:
        assert len(line) > 80 and line.rstrip().endswith(f"eval/greedy_accuracy={line.rpartition('=')[2]}")
        for key in ("eval/reward=", "eval/pass@1=", "eval/pass@2=", "eval/greedy_accuracy="):
            assert key in line, line
    assert not [line for line in lines if line.startswith("eval/")], "an eval line wrapped:\n" + result.stderr
    done = [line for line in lines if line.startswith("done: ")]
    assert len(done) == 1 and "train_loss=" in done[0] and "reward=" in done[0], result.stderr
    # transformers draws "Loading weights" when the model loads and "Writing model shards" when final/ is saved
    for bar in ("Loading weights", "Loading checkpoint shards", "Writing model shards", "it/s]"):
        assert bar not in result.stderr + result.stdout, result.stderr
    assert (tmp_path / "run" / "final" / "model.safetensors").is_file()  # final/ was written, quietly
