"""One torchrun rank of tests/real_vllm/test_torchrun_vllm.py: GRPOTrainer with generation.engine vllm (every rank
its own engine), then this rank's facts about its engine in OUT/rank-R.json.

    python -m torch.distributed.run --standalone --nproc_per_node 2 torchrun_vllm_script.py OUT MODEL STRATEGY
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from real_vllm_helpers import SETTINGS, TARGET_REWARD, prompts

from grpokit import GRPOConfig, GRPOTrainer


def main(out: Path, model_dir: str, strategy: str) -> None:
    import torch.distributed as dist

    args = GRPOConfig(
        **{
            **SETTINGS,
            "output_dir": str(out / "run"),
            "dtype": "float32",
            "max_steps": 3,
            "per_device_train_batch_size": 4,  # 2 ranks x 4 = 8 completions: 2 prompts x G = 4 per step
            "strategy": strategy,
            "seed_per_group": True,
            "lr_scheduler_type": "constant",
        }
    )
    trainer = GRPOTrainer(model_dir, TARGET_REWARD, args=args, train_dataset=prompts())
    trainer.train()
    engine = trainer.engine
    full_bytes = sum(p.numel() * p.element_size() for p in engine.policy.parameters())  # a DTensor's: its whole size
    facts = {
        "rank": dist.get_rank(),
        "engine": type(engine).__name__,
        "seed": engine.llm_kwargs["seed"],
        "syncs": engine.syncs,
        "version": engine.policy_version,
        "stream_peak_bytes": engine.stream_peak_bytes,
        "stream_total_bytes": engine.stream_total_bytes,
        "model_bytes": full_bytes,
        "default_group_alive": dist.is_initialized(),
    }
    (out / f"rank-{dist.get_rank()}.json").write_text(json.dumps(facts))


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2], sys.argv[3])
