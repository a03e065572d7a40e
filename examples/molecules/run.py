"""SMILES generation with GRPO against RDKit rewards.

1. Pre-train a character-level GPT (``chargpt.py``, plain PyTorch) on 20,000 MOSES molecules
   (cached under ``cache/``, so reruns skip it).
2. Sample molecules and measure validity, uniqueness, novelty, mean QED and mean SA.
3. GRPO with the rewards of the config (``config.yaml``: validity + QED; ``config_sa.yaml``:
   validity + SA), the KL reference resynced every ``ref_model_sync_steps``.
4. Sample and measure again; print both, and write them to ``<output_dir>/molecules.json``.

    python examples/molecules/run.py                          # validity + QED
    python examples/molecules/run.py --config config_sa.yaml  # validity + SA
    python examples/molecules/run.py max_steps=10             # any config key=value override
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import fields
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from chargpt import PretrainConfig, load_or_pretrain

from grpokit import GRPOTrainer, load_config
from grpokit.data.smiles import BOS, canonical_set, molecule_metrics, read_smiles
from grpokit.models.loading import decode
from grpokit.rollout.types import SamplingParams

METRICS = ("validity", "uniqueness", "novelty", "qed", "sa")


def sample(trainer: GRPOTrainer, n: int, batch: int = 250) -> list[str]:
    """``n`` SMILES sampled from the current policy at the config's temperature, via grpokit's sampler."""
    args, prompt = trainer.args, trainer.tokenizer.encode(BOS)
    params = SamplingParams(
        args.max_completion_length, args.temperature, args.top_p, args.top_k, args.min_p, args.repetition_penalty
    )
    out = []
    for start in range(0, n, batch):
        rollouts = trainer.engine.generate([prompt], min(batch, n - start), params)
        out += [
            decode(trainer.tokenizer, ids[: int(k)].tolist())
            for ids, k in zip(rollouts.completion_ids, rollouts.completion_lengths)
        ]
    return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="config.yaml", help="GRPO config, relative to this folder or a path")
    parser.add_argument(
        "--data", default=str(HERE / "data" / "moses_sample.smi"), help=".smi file of training molecules"
    )
    parser.add_argument("--cache-dir", default=str(HERE / "cache"), help="where the pre-trained model is kept")
    parser.add_argument("--samples", type=int, default=1000, help="molecules sampled for each measurement")
    for f in fields(PretrainConfig):
        parser.add_argument(f"--pretrain-{f.name.replace('_', '-')}", type=type(f.default), default=f.default)
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch CPU threads; the models are so small that one thread beats several "
        "(their matmuls are too small to split)",
    )
    parser.add_argument("overrides", nargs="*", help="config overrides, key=value")
    return parser.parse_intermixed_args(argv)  # options and key=value overrides in any order


def main(argv: list[str] | None = None) -> dict:
    opts = parse_args(argv)
    torch.set_num_threads(opts.threads)
    config_path = Path(opts.config) if Path(opts.config).is_file() else HERE / opts.config
    args = load_config(config_path, opts.overrides)
    smiles = read_smiles(opts.data)
    pretrain_config = PretrainConfig(**{f.name: getattr(opts, f"pretrain_{f.name}") for f in fields(PretrainConfig)})
    t0 = time.perf_counter()
    model, tokenizer, folder = load_or_pretrain(smiles, pretrain_config, opts.cache_dir)
    print(f"pre-trained model: {folder} ({time.perf_counter() - t0:.0f}s)")
    training_set = canonical_set(smiles)

    # Unconditional generation: every prompt is the start token, and each prompt's G samples form one
    # group. A step draws distinct rows, so the dataset holds one identical row per group of a step.
    rows = [{"prompt": BOS}] * args.prompts_per_step()
    trainer = GRPOTrainer(model=model, tokenizer=tokenizer, args=args, train_dataset=rows)
    torch.manual_seed(args.seed)
    before = molecule_metrics(sample(trainer, opts.samples), training_set)
    t1 = time.perf_counter()
    trainer.train()
    grpo_seconds = time.perf_counter() - t1
    after = molecule_metrics(sample(trainer, opts.samples), training_set)

    print(f"\n{'metric':<12}{'before':>10}{'after':>10}")
    for name in METRICS:
        print(f"{name:<12}{before[name]:>10.3f}{after[name]:>10.3f}")
    result = {
        "config": str(config_path),
        "samples": opts.samples,
        "before": before,
        "after": after,
        "grpo_seconds": grpo_seconds,
        "total_seconds": time.perf_counter() - t0,
    }
    (Path(args.output_dir) / "molecules.json").write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
