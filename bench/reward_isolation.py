"""Cost of running reward functions in killable worker processes (``reward_isolation: true``, the
default) against threads in the trainer's process (``false``); prints ratios isolated / in-process.

1. A 64 x 1,000-character batch scored by the built-ins accuracy, format and length.
2. The demo config (examples/arithmetic/config.yaml) for ``--steps`` steps: mean ``time/reward``
   and ``step_time`` per step, on the cached demo policy (``grpokit demo`` builds it) or else an
   untrained model of its architecture.

    python bench/reward_isolation.py [--batches 50] [--steps 5] [--skip-demo]
"""

from __future__ import annotations

import argparse
import random
import statistics
import string
import tempfile
import time
from pathlib import Path

from grpokit.rewards import RewardRunner

SPECS = [
    "accuracy",
    {"name": "format", "pattern": r"(?s).*\\boxed\{.*\}.*"},
    {"name": "length", "max_length": 1200, "cache_length": 200},
]


def batch_ms(isolate: bool, batches: int, size: int = 64, chars: int = 1000) -> float:
    rng = random.Random(0)
    alphabet = string.ascii_letters + string.digits + "  \n.,"
    completions = ["".join(rng.choices(alphabet, k=chars - 12)) + r" \boxed{42}." for _ in range(size)]
    prompts = ["".join(rng.choices(alphabet, k=300))] * size
    columns = {"answer": ["42"] * size, "completion_lengths": [chars // 4] * size}
    ids = [list(range(chars // 4))] * size
    with RewardRunner(SPECS, isolate=isolate) as runner:
        runner.score(prompts, completions, columns, group_size=8, completion_ids=ids)  # warm-up
        times = []
        for _ in range(batches):
            start = time.perf_counter()
            runner.score(prompts, completions, columns, group_size=8, completion_ids=ids)
            times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def demo_model(folder: Path) -> Path:
    """The cached warm-started demo policy; without it, the same architecture and tokenizer untrained
    (the reward work per step is the same: 128 completions of at most 4 tokens, two rewards)."""
    from grpokit.data.arithmetic import ALPHABET
    from grpokit.data.char_tokenizer import build_char_tokenizer
    from grpokit.demo.warmstart import VERSION, WarmStartConfig, _is_current, build_model, default_cache_root

    cached = default_cache_root() / f"demo-policy-v{VERSION}"
    if _is_current(cached, WarmStartConfig()):
        return cached
    tokenizer = build_char_tokenizer(ALPHABET)
    build_model(tokenizer, WarmStartConfig()).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    print(f"(no cached demo policy at {cached}: an untrained model of its architecture)")
    return folder


def demo_step(isolate: bool, steps: int) -> tuple[float, float]:
    """(mean time/reward, mean step_time) in ms over ``steps`` demo steps."""
    from grpokit.config import load_config
    from grpokit.kernels import keep_freed_memory
    from grpokit.trl.trainer import GRPOTrainer

    keep_freed_memory()  # the demo's steps as `grpokit train` runs them
    config = Path(__file__).resolve().parents[1] / "examples" / "arithmetic" / "config.yaml"
    with tempfile.TemporaryDirectory() as out:
        policy = demo_model(Path(out) / "policy")
        cfg = load_config(
            str(config),
            [
                f"model_name_or_path={policy}",
                f"max_steps={steps}",
                "eval_steps=0",
                f"output_dir={out}",
                "progress_bar=false",
                "report_to=[jsonl]",
                f"reward_isolation={str(isolate).lower()}",
            ],
        )
        trainer = GRPOTrainer(args=cfg)
        times = []
        original = trainer.loop._train_step

        def timed(step):
            metrics = original(step)
            times.append((metrics["time/reward"], metrics["step_time"]))
            return metrics

        trainer.loop._train_step = timed
        trainer.train()
    rewards, totals = zip(*times[1:] or times)  # the first step pays for start-up
    return 1000 * statistics.mean(rewards), 1000 * statistics.mean(totals)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=50)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--skip-demo", action="store_true")
    args = parser.parse_args()
    threads, isolated = batch_ms(False, args.batches), batch_ms(True, args.batches)
    print(
        f"batch 64 x 1000 chars: in_process_ms={threads:.2f} isolated_ms={isolated:.2f} "
        f"ratio_isolated_over_in_process={isolated / threads:.2f}"
    )
    if not args.skip_demo:
        (r0, s0), (r1, s1) = demo_step(False, args.steps), demo_step(True, args.steps)
        print(
            f"demo step: in_process reward_ms={r0:.2f} step_ms={s0:.1f}; isolated reward_ms={r1:.2f} "
            f"step_ms={s1:.1f}; reward ratio={r1 / r0:.2f} step ratio={s1 / s0:.3f} "
            f"(extra per step {r1 - r0:.2f} ms = {100 * (r1 - r0) / s0:.2f} % of a step)"
        )


if __name__ == "__main__":
    main()
