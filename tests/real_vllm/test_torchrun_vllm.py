"""vLLM on every torchrun rank (TRL's colocate mode) with the real vLLM CPU build: 2 gloo ranks, each with its own
engine, trained through GRPOTrainer with DDP and with FSDP2. After every update every rank's engine loads the
weights (3 steps: 3 syncs on each rank), the float32 log-prob gap of the sampled tokens stays <= GAP_FP32 at every
step, and under FSDP2 the weights stream one parameter at a time: the peak of gathered tensors alive at once is a
small part of the model (vLLM's loader buffers the pieces of one fused layer), never the whole of it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from real_vllm_helpers import GAP_FP32, metrics

HERE = Path(__file__).parent


def torchrun_trainer(out: Path, model_dir: Path, strategy: str) -> list[dict]:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore", PYTHONFAULTHANDLER="1", HF_HUB_OFFLINE="1")
    env.pop("VLLM_CPU_KVCACHE_SPACE", None)  # each engine takes the run's vllm_kv_cache_gib (0.25), not 1 GiB
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), *filter(None, [env.get("PYTHONPATH")])])
    proc = subprocess.run(
        [
            *(sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"),
            *(str(HERE / "torchrun_vllm_script.py"), str(out), str(model_dir), strategy),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,  # two vLLM starts and 3 steps on a shared 2-core machine take ~1-2 min; a hang ends here
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-8000:]
    return [json.loads((out / f"rank-{r}.json").read_text()) for r in range(2)]


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_two_ranks_each_with_an_engine(tmp_path, vllm_model_dir, strategy):
    ranks = torchrun_trainer(tmp_path, vllm_model_dir, strategy)
    for rank, facts in enumerate(ranks):
        assert facts["rank"] == rank and facts["engine"] == "ColocatedVLLMEngine"
        assert facts["seed"] == rank  # TRL's rank // tensor_parallel_size
        assert facts["version"] == 3 and facts["syncs"] == 3  # a load after every update, on every rank
        assert facts["default_group_alive"]  # vLLM never destroyed the trainer's process group
    lines = metrics(tmp_path / "run")
    print(strategy, ranks, [line["sampling_is/logprob_abs_diff"] for line in lines])  # the numbers, with -s
    assert [line["step"] for line in lines] == [1, 2, 3]
    for line in lines:  # the mean over ranks of each rank's mean gap per sampled token
        assert line["sampling_is/logprob_abs_diff"] <= GAP_FP32, line
    if strategy == "fsdp":
        for facts in ranks:
            assert facts["stream_total_bytes"] == facts["model_bytes"]  # every parameter gathered, once
            assert 0 < facts["stream_peak_bytes"] <= facts["model_bytes"] / 2, facts  # never the whole model
    else:
        assert all(facts["stream_total_bytes"] == 0 for facts in ranks)  # DDP: the policy's own tensors, no copies
