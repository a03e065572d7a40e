"""A single-process run never imports grpokit.distributed (grpokit.system.processes.SingleProcess stands in for it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from shared_helpers import WORDS
from test_train import write_config

WATCH = """
import json, sys
from grpokit.cli import main

codes = [main(["train", sys.argv[1], "max_steps=1", "save_steps=1"]),
         main(["train", sys.argv[1], "max_steps=2", "resume_from=latest"])]
loaded = sorted(m for m in sys.modules if m == "grpokit.distributed" or m.startswith("grpokit.distributed."))
print(json.dumps({"codes": codes, "distributed": loaded}))
"""


def test_a_single_process_run_does_not_import_distributed(tmp_path, tiny_model_dir, word_prompts):
    """Train a step with a checkpoint, an evaluation and the final model, then resume for a second step, in a
    fresh interpreter (other tests import grpokit.distributed into this one)."""
    evals = tmp_path / "eval.jsonl"
    evals.write_text(
        "".join(json.dumps({"prompt": " ".join(WORDS[i : i + 5]), "target": "w7"}) + "\n" for i in range(2))
    )
    config = write_config(
        tmp_path,
        tiny_model_dir,
        word_prompts,
        optim={"per_device_train_batch_size": 4, "gradient_accumulation_steps": 1},
        data={"eval_dataset": str(evals)},
        eval={"eval_steps": 1, "num_generations_eval": 2, "pass_at_k": [1]},
    )
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    env.pop("WORLD_SIZE", None)
    proc = subprocess.run(
        [sys.executable, "-c", WATCH, str(config)], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result == {"codes": [0, 0], "distributed": []}
    assert (tmp_path / "run" / "checkpoints" / "step-1").is_dir() and (tmp_path / "run" / "final").is_dir()
