"""Bounded staleness on the demo task: synchronous (max_staleness 0) against K = 1, 2 and 4, with a reward that
sleeps a fixed time per call (a stand-in for a remote verifier, a sandbox or an LLM judge) and without it.

For each setting: wall-clock per training step (the steps' own time, evaluations left out), the learner's idle
fraction (the share of each step it waited for rollouts and rewards: time/generate + time/reward over step_time),
the mean staleness, and held-out pass@1 at the end (100 questions, 8 samples each, at the training temperature).
Without Ray the rollouts are sampled ahead by a copy of the policy on a background thread (grpokit's hf engine),
and scored there too; the learner thread trains meanwhile. Torch runs one thread per Python thread
(``single_thread``), so on a 2-core machine the learner and the producer each get one core.

    python bench/async_staleness.py [--steps 30] [--sleep 1.0] [--ks 0 1 2 4] [--skip-fast]

Needs the demo's warm-started policy (``grpokit demo`` caches it; built here if missing, about 90 s).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

SLEEP_SECONDS = 1.0  # per reward call (one call per batch of 128 completions); --sleep sets it


def slow_correct(prompts, completions, answer, **columns) -> list[float]:
    """The demo's correctness reward after a fixed sleep per call (the batch's)."""
    import os

    from grpokit.data.arithmetic import arithmetic_correct

    time.sleep(float(os.environ.get("GRPOKIT_BENCH_SLEEP", SLEEP_SECONDS)))
    return arithmetic_correct(prompts, completions, answer)


def run_one(k: int, steps: int, slow: bool, out: Path, correction: str) -> dict:
    from grpokit.config import load_config
    from grpokit.demo import ensure_demo_policy
    from grpokit.demo.run import CONFIG_PATH
    from grpokit.demo.warmstart import single_thread
    from grpokit.trl.trainer import GRPOTrainer

    with single_thread():
        policy = ensure_demo_policy()
        correct = f"{Path(__file__).resolve()}:slow_correct" if slow else "grpokit.data.arithmetic:arithmetic_correct"
        settings = {
            "model_name_or_path": str(policy),
            "output_dir": str(out),
            "max_steps": steps,
            "warmup_steps": 0,
            "eval_steps": steps,  # before training and at the end
            "max_staleness": k,
            "off_policy_correction": correction,
            "report_to": ["jsonl"],
            "progress_bar": False,
            "rewards": [correct, "grpokit.data.arithmetic:arithmetic_format"],
            "reward_isolation": False,  # the sleep stands for remote work; no worker process in the way
            "scoring_threads": k + 1,  # the K + 1 batches in flight scored at once, as a remote verifier would be
        }
        trainer = GRPOTrainer(args=load_config(CONFIG_PATH, settings))
        started = time.perf_counter()
        trainer.train()
        wall = time.perf_counter() - started
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    trained = [m for m in lines if "step_time" in m]
    evals = [m for m in lines if "eval/pass@1" in m]
    step_time = [m["step_time"] for m in trained]
    waited = [m.get("time/generate", 0.0) + m.get("time/reward", 0.0) for m in trained]
    return {
        "k": k,
        "slow_reward": slow,
        "steps": len(trained),
        "step_s": statistics.mean(step_time),
        "idle_fraction": sum(waited) / sum(step_time),
        "staleness_mean": statistics.mean(m["policy_staleness"] for m in trained),
        "pass1_before": evals[0]["eval/pass@1"],
        "pass1_after": evals[-1]["eval/pass@1"],
        "wall_s": wall,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--sleep", type=float, default=SLEEP_SECONDS, help="seconds per reward call")
    parser.add_argument("--ks", type=int, nargs="+", default=[0, 1, 2, 4])
    parser.add_argument("--correction", default="decoupled_ppo", choices=["behaviour", "decoupled_ppo"])
    parser.add_argument("--skip-fast", action="store_true", help="only the runs with the slow reward")
    args = parser.parse_args()
    import os

    os.environ["GRPOKIT_BENCH_SLEEP"] = str(args.sleep)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for slow in [True] if args.skip_fast else [True, False]:
            for k in args.ks:
                row = run_one(k, args.steps, slow, Path(tmp) / f"k{k}-{'slow' if slow else 'fast'}", args.correction)
                rows.append(row)
                print(json.dumps(row), flush=True)
    print()
    print(
        f"| reward | K | s / step | vs sync | learner idle | staleness | pass@1 before -> after ({args.steps} steps) |"
    )
    print("|---|---|---|---|---|---|---|")
    for row in rows:
        sync = next(r for r in rows if r["slow_reward"] == row["slow_reward"] and r["k"] == 0)
        label = f"sleeps {args.sleep:g} s" if row["slow_reward"] else "instant"
        print(
            f"| {label} | {row['k']} | {row['step_s']:.2f} | {row['step_s'] / sync['step_s']:.2f}x | "
            f"{row['idle_fraction']:.0%} | {row['staleness_mean']:.2f} | "
            f"{row['pass1_before']:.2f} -> {row['pass1_after']:.2f} |"
        )


if __name__ == "__main__":
    main()
