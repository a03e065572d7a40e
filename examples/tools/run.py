"""A tiny model learns to call a calculator for questions it cannot answer by heart.

1. Build the task (``calculator.py``): ``What is 47*86?`` (two-digit products, hard) and ``What is 3+5?``
   (one-digit sums, easy); held-out hard questions are never trained on.
2. Warm-start the policy (``warm_start.py``, a 0.14M-parameter Llama, character-level tokenizer and a
   tool chat template from ``chat_format.py``): first on a teacher that calls the calculator on most hard
   questions and otherwise guesses by heart, then on one that calls one time in ten. Cached under
   ``cache/``, so reruns skip this.
3. Measure on the held-out questions (``measure.py``): answer accuracy and tool-use rate, sampled and
   greedy, in multi-turn rollouts with the calculator.
4. GRPO with the calculator as a tool and the right final answer as the only reward.
5. Measure again; print both, and write them to ``<output_dir>/tools.json``.

    python examples/tools/run.py
    python examples/tools/run.py max_steps=20          # any config key=value override
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, fields
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

HERE = Path(__file__).resolve().parent
# Part of the cache key: bump it when the task, the chat format or the warm start change in code.
CACHE_VERSION = 1
sys.path.insert(0, str(HERE))

from calculator import answer_correct, calculator, splits
from chat_format import tool_tokenizer
from measure import measure
from warm_start import WarmStartConfig, warm_start

from grpokit import GRPOTrainer, load_config
from grpokit.system.cached_folders import cached_folder


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="config.yaml", help="GRPO config, relative to this folder or a path")
    parser.add_argument("--cache-dir", default=str(HERE / "cache"), help="where the warm-started policy is kept")
    parser.add_argument("--n-eval", type=int, default=200, help="held-out hard questions (never trained on)")
    parser.add_argument("--eval-samples", type=int, default=4, help="sampled rollouts per held-out question")
    for f in fields(WarmStartConfig):
        parser.add_argument(f"--warm-{f.name.replace('_', '-')}", type=type(f.default), default=f.default)
    parser.add_argument(
        "--threads", type=int, default=1, help="torch CPU threads; one beats several for a model this small"
    )
    parser.add_argument("overrides", nargs="*", help="config overrides, key=value")
    return parser.parse_intermixed_args(argv)  # options and key=value overrides in any order


def main(argv: list[str] | None = None) -> dict:
    opts = parse_args(argv)
    torch.set_num_threads(opts.threads)
    config_path = Path(opts.config) if Path(opts.config).is_file() else HERE / opts.config
    args = load_config(config_path, opts.overrides)
    warm = WarmStartConfig(**{f.name: getattr(opts, f"warm_{f.name}") for f in fields(WarmStartConfig)})
    hard_train, held_out, easy = splits(opts.n_eval)
    t0 = time.perf_counter()

    def build_policy(folder: Path) -> None:
        tokenizer = tool_tokenizer()
        warm_start(hard_train, easy, tokenizer, warm).save_pretrained(folder)
        tokenizer.save_pretrained(folder)

    recipe = {"version": CACHE_VERSION, "n_eval": opts.n_eval, "warm_start": asdict(warm)}
    policy_dir = cached_folder(Path(opts.cache_dir), "policy", recipe, build_policy)
    warm_seconds = time.perf_counter() - t0

    def evaluate(model, tokenizer) -> dict[str, dict[str, float]]:
        common = dict(
            max_completion_length=args.max_completion_length,
            max_tool_calling_iterations=args.max_tool_calling_iterations,
            temperature=args.temperature,
            seed=args.seed,
        )
        return {
            "held_out": measure(model, tokenizer, held_out, samples=opts.eval_samples, **common),
            "easy": measure(model, tokenizer, easy, samples=1, **common),
        }

    before = evaluate(
        AutoModelForCausalLM.from_pretrained(policy_dir).eval(), AutoTokenizer.from_pretrained(policy_dir)
    )
    trainer = GRPOTrainer(
        model=str(policy_dir),
        reward_funcs=[answer_correct],
        args=args,
        train_dataset=hard_train + easy,
        tools=[calculator],
    )
    t1 = time.perf_counter()
    trainer.train()
    grpo_seconds = time.perf_counter() - t1
    after = evaluate(trainer.model, trainer.tokenizer)

    print(f"\n{'':<34}{'before':>10}{'after':>10}")
    for split, label in (("held_out", f"held-out hard ({len(held_out)})"), ("easy", f"easy ({len(easy)}, trained)")):
        for name, value in before[split].items():
            print(f"{label + ' ' + name:<34}{value:>10.3f}{after[split][name]:>10.3f}")
    result = {
        "config": str(config_path),
        "n_eval": len(held_out),
        "before": before,
        "after": after,
        "warm_start_seconds": warm_seconds,
        "grpo_seconds": grpo_seconds,
        "total_seconds": time.perf_counter() - t0,
    }
    print(f"warm start {warm_seconds:.0f}s, GRPO {grpo_seconds:.0f}s, total {result['total_seconds']:.0f}s")
    (Path(args.output_dir) / "tools.json").write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
