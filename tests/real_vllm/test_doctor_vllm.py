"""`grpokit doctor` with the real vLLM engine (CPU build) and top-p: the sampler-learner parity check passes (vLLM
samples the learner's weights, loaded at start) and says that vLLM's log-probs are those of the processed (top-p
filtered) distribution the tokens were drawn from, whose gap to the learner's raw ones is the renormalisation."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import yaml
from real_vllm_helpers import SETTINGS, TARGET_REWARD, prompts


def test_doctor_with_vllm_and_top_p(tmp_path, vllm_model_dir):
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in prompts()))
    values = {**SETTINGS, "model_name_or_path": str(vllm_model_dir), "train_dataset": str(data), "top_p": 0.8}
    values["output_dir"] = str(tmp_path / "run")
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({**values, "rewards": [TARGET_REWARD]}))
    proc = subprocess.run(
        [sys.executable, "-m", "grpokit.cli", "doctor", "--groups", "2", str(config)],
        env=dict(os.environ, HF_HUB_OFFLINE="1"),
        capture_output=True,
        text=True,
        timeout=600,  # a generous bound on a busy 2-core machine; it takes ~40 s
        check=False,
    )
    out = proc.stdout
    found = [line for line in out.splitlines() if line.startswith(("PASS  sampler", "FAIL  sampler"))]
    assert found and found[0].startswith("PASS  sampler-learner parity: engine vllm: "), out + proc.stderr[-3000:]
    parity = found[0]
    assert "vLLM's log-probs are the processed distribution's (after filtering" in parity
    # the gap is log(1/Z): top-p 0.8 keeps a mass Z in [0.8, 1], so it lies in [0, -log 0.8 = 0.223]
    mean = float(parity.split("(mean ")[1].split(")")[0])
    assert 0.0 <= mean <= 0.2232
    assert not (tmp_path / "run").exists()  # the doctor writes nothing
