"""What ``ref_model_dtype: bfloat16`` changes: the reference log-probs and the KL term, at Qwen2.5-0.5B's shape.

The random-init model of ``bench/vs_trl.py --shapes qwen0.5b`` (``--layers N`` shrinks it), one step's batch of
4 prompts x 8 completions of 64 tokens (random tokens: the log-probs of a random-init model are as spread for them as
for its samples). For each compute mode (bf16 autocast where the CPU has native bf16 matmul, and float32), the
reference log-probs of the reference stored as usual and in bf16, and the policy's log-probs (the same weights, as at
step 1): prints the largest and mean absolute log-prob difference and the mean k3 KL term against the policy, which
is the KL the bf16 reference adds where the usual reference has none.

    python bench/ref_dtype.py --layers 4     # ~1 min, ~4 GB; without --layers the 24-layer model: ~3 min, ~8 GB
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
import vs_trl  # the benchmark's model and prompts

from grpokit import GRPOConfig
from grpokit.machine.cpu_caps import cpu_caps
from grpokit.models.loading import load_model
from grpokit.rollout.types import Rollouts
from grpokit.train.learning.learner import Learner
from grpokit.train.learning.policy_logprobs import batched_logprobs, build_batch
from grpokit.train.learning.reference import Reference

PROMPTS, T = 4, 64


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=None, help="layers of the model (default: Qwen2.5-0.5B's 24)")
    parser.add_argument("--workdir", type=Path, default=None, help="a vs_trl.py work folder to reuse")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        workdir = args.workdir or Path(tmp)
        vs_trl.build_inputs(workdir, "qwen0.5b", args.layers)
        tokenizer = vs_trl.load_tokenizer(workdir)
        rows = [json.loads(line) for line in (workdir / "prompts.jsonl").read_text().splitlines()][:PROMPTS]
        prompt_ids = [tokenizer(r["prompt"], add_special_tokens=False)["input_ids"] for r in rows]
        cpu = torch.device("cpu")
        policy = load_model(str(workdir / "model"), torch.float32, cpu).eval()
        gen = torch.Generator().manual_seed(0)
        n = PROMPTS * vs_trl.G
        rollouts = Rollouts(
            prompt_ids=prompt_ids,
            completion_ids=torch.randint(4, len(tokenizer), (n, T), generator=gen),
            completion_mask=torch.ones(n, T),
            logprobs=torch.zeros(n, T),
            finish_reasons=["length"] * n,
            num_generations=vs_trl.G,
        )
        batch = build_batch(policy, rollouts, tokenizer.pad_token_id, cpu)
        modes = [torch.bfloat16, None] if cpu_caps().native_bf16 else [None]
        for autocast_dtype in modes:
            cfg = GRPOConfig(beta=0.04, num_generations=vs_trl.G, per_device_train_batch_size=n)
            ref = {}
            for dtype in ("auto", "bfloat16"):
                learner = Learner(
                    policy,
                    Reference(policy, False),
                    None,
                    None,
                    cfg.replace(ref_model_dtype=dtype),
                    autocast_dtype=autocast_dtype,
                )
                ref[dtype] = learner.reference_logprobs(batch)
                del learner
            with learner_autocast(autocast_dtype):
                logp = batched_logprobs(policy, batch, 1.0, n)
            name = "bf16 autocast" if autocast_dtype else "float32"
            for dtype, r in ref.items():
                delta = r - logp
                k3 = (delta.exp() - delta - 1).mean()
                print(
                    f"{name:>13}, reference {dtype:>8}: |ref - logp| max {delta.abs().max():.2e} mean "
                    f"{delta.abs().mean():.2e}; mean k3 KL {k3:.2e}"
                )
            diff = (ref["bfloat16"] - ref["auto"]).abs()
            print(f"{name:>13}: bf16 reference vs usual: max {diff.max():.2e}, mean {diff.mean():.2e}")


def learner_autocast(dtype):
    from grpokit.machine.hardware import autocast

    return autocast(torch.device("cpu"), dtype)


if __name__ == "__main__":
    main()
