"""Single-step fill-in with a learned judge as the reward.

1. Build the task (``spans.py``): windows of ordered lists with one span masked; held-out texts
   are never trained on, neither by the policy nor by the judge.
2. Train the judge (``judge.py``, a plain PyTorch scorer) to tell real spans from near misses,
   and warm-start the policy (``policy.py``, a tiny Llama) on a sloppy teacher. Both are cached
   under ``cache/``, so reruns skip this.
3. Measure on the held-out prompts: mean judge score and exact-match rate of sampled completions.
4. GRPO with the frozen judge as the only reward (the built-in ``reward_model`` on the filled-in
   text: the sigmoid of the judge's logit).
5. Measure again; print both, and write them to ``<output_dir>/fill_in.json``.

    python examples/fill_in/run.py
    python examples/fill_in/run.py max_steps=20          # any config key=value override
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, fields
from pathlib import Path

import torch
from safetensors.torch import load_model, save_model

HERE = Path(__file__).resolve().parent
# Part of every cache key: bump it when the task, the judge or the warm start change in code.
CACHE_VERSION = 1
sys.path.insert(0, str(HERE))

import spans
from judge import Judge, JudgeConfig, judge_accuracy, judge_reward, train_judge
from policy import PolicyConfig, fill_in_tokenizer, warm_start

from grpokit import GRPOTrainer, load_config
from grpokit.models.loading import decode
from grpokit.rollout.types import SamplingParams
from grpokit.system.cached_folders import cached_folder


@torch.no_grad()
def measure(trainer: GRPOTrainer, reward, texts: list[spans.Text], greedy: bool = False) -> dict[str, float]:
    """Mean judge score (sigmoid) and exact-match rate of one completion per held-out prompt."""
    args, tokenizer = trainer.args, trainer.tokenizer
    params = SamplingParams(
        args.max_completion_length,
        args.temperature,
        args.top_p,
        args.top_k,
        args.min_p,
        args.repetition_penalty,
        greedy=greedy,
    )
    rollouts = trainer.engine.generate([tokenizer.encode(t.prompt) for t in texts], 1, params)
    completions = [
        decode(tokenizer, ids[: int(k)].tolist())
        for ids, k in zip(rollouts.completion_ids, rollouts.completion_lengths)
    ]
    scores = reward([t.prompt for t in texts], completions)
    return {
        "judge_score": sum(scores) / len(scores),
        "exact_match": sum(spans.exact_match(c, t.answer) for c, t in zip(completions, texts)) / len(texts),
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="config.yaml", help="GRPO config, relative to this folder or a path")
    parser.add_argument(
        "--cache-dir", default=str(HERE / "cache"), help="where the judge and the warm-started policy are kept"
    )
    parser.add_argument("--n-eval", type=int, default=300, help="held-out texts (never trained on)")
    for prefix, cls in (("policy", PolicyConfig), ("judge", JudgeConfig)):
        for f in fields(cls):
            parser.add_argument(f"--{prefix}-{f.name.replace('_', '-')}", type=type(f.default), default=f.default)
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
    cache_dir = Path(opts.cache_dir)
    policy_config = PolicyConfig(**{f.name: getattr(opts, f"policy_{f.name}") for f in fields(PolicyConfig)})
    judge_config = JudgeConfig(**{f.name: getattr(opts, f"judge_{f.name}") for f in fields(JudgeConfig)})
    train_texts, eval_texts = spans.splits(opts.n_eval)
    tokenizer = fill_in_tokenizer()
    t0 = time.perf_counter()

    def build_policy(folder: Path) -> None:
        warm_start(train_texts, tokenizer, policy_config).save_pretrained(folder)
        tokenizer.save_pretrained(folder)

    def build_judge(folder: Path) -> None:
        save_model(train_judge(train_texts, tokenizer, judge_config), str(folder / "judge.safetensors"))

    data_recipe = {"version": CACHE_VERSION, "n_eval": opts.n_eval, "tasks": sorted(spans.LISTS)}
    policy_dir = cached_folder(cache_dir, "policy", {"policy": asdict(policy_config), **data_recipe}, build_policy)
    judge_dir = cached_folder(cache_dir, "judge", {"judge": asdict(judge_config), **data_recipe}, build_judge)
    judge = Judge(len(tokenizer), judge_config)
    load_model(judge, str(judge_dir / "judge.safetensors"))
    judge.eval().requires_grad_(False)
    print(
        f"judge accuracy on held-out real vs corrupted spans: {judge_accuracy(judge, tokenizer, eval_texts):.3f} "
        f"(prepared in {time.perf_counter() - t0:.0f}s)"
    )

    reward = judge_reward(judge, tokenizer)
    trainer = GRPOTrainer(
        model=str(policy_dir), reward_funcs=[reward], args=args, train_dataset=spans.rows(train_texts)
    )
    torch.manual_seed(args.seed)
    before = {
        **measure(trainer, reward, eval_texts),
        **{f"greedy_{k}": v for k, v in measure(trainer, reward, eval_texts, greedy=True).items()},
    }
    t1 = time.perf_counter()
    trainer.train()
    grpo_seconds = time.perf_counter() - t1
    after = {
        **measure(trainer, reward, eval_texts),
        **{f"greedy_{k}": v for k, v in measure(trainer, reward, eval_texts, greedy=True).items()},
    }

    print(f"\n{'held-out metric':<22}{'before':>10}{'after':>10}")
    for name, value in before.items():
        print(f"{name:<22}{value:>10.3f}{after[name]:>10.3f}")
    result = {
        "config": str(config_path),
        "n_eval": len(eval_texts),
        "before": before,
        "after": after,
        "grpo_seconds": grpo_seconds,
        "total_seconds": time.perf_counter() - t0,
    }
    (Path(args.output_dir) / "fill_in.json").write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
