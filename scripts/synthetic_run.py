"""Write a synthetic run folder shaped like a real one: `synthetic_run.py OUT [--steps N] [--groups B] [-G N]`.

config.yaml, and a store with every metric family a GRPO step logs, B groups of G rollouts per step (an
arithmetic task whose policy improves), and an evaluation every `--eval-every` steps with per-prompt results.
The report's size test, its browser test, bench/report_open.py and the docs' screenshots read such runs. Seeded:
the same arguments give the same rows.
"""

from __future__ import annotations

import argparse
import math
import random
from pathlib import Path

import yaml

from grpokit.store import RolloutRecord, RolloutStore
from grpokit.store.token_values import encode


def write_synthetic_run(
    run: Path,
    steps: int = 100,
    groups: int = 5,
    group_size: int = 10,
    eval_every: int = 25,
    eval_prompts: int = 100,
    seed: int = 0,
    config: dict | None = None,
    token_values: bool = False,
) -> Path:
    """The run folder ``run`` (created) with ``steps`` steps of ``groups`` x ``group_size`` rollouts; with
    ``token_values``, every completion's per-token values (run.store_token_values: [all])."""
    rng = random.Random(seed)
    run.mkdir(parents=True)
    base = {
        "model": {"model_name_or_path": "synthetic-policy"},
        "algo": {"num_generations": group_size, "loss_type": "dapo", "beta": 0.04},
        "optim": {"max_steps": steps, "learning_rate": 1e-4},
        "eval": {"success_threshold": 1.0},
    }
    (run / "config.yaml").write_text(yaml.safe_dump(_merge(base, config or {})))
    skill = [rng.uniform(-2.0, 2.0) for _ in range(eval_prompts)]  # per held-out prompt: how hard it is
    with RolloutStore(run) as store:
        for step in range(0, steps + 1):
            p = 0.3 + 0.6 * step / steps  # the chance a completion is right
            if step:
                records = _rollouts(rng, step, groups, group_size, p)
                if token_values:
                    _token_values(rng, records)
                store.write_step(step, records, _metrics(rng, step, steps, records, group_size))
            if step % eval_every == 0 or step == steps:
                results = _eval_prompts(rng, skill, p, step, steps)
                solved = [r["correct"] / r["samples"] for r in results]
                metrics = {
                    "eval/pass@1": sum(solved) / len(solved),
                    "eval/pass@8": sum(r["correct"] > 0 for r in results) / len(results),
                    "eval/reward": sum(solved) / len(solved) + 0.1,
                    "eval/num_prompts": float(len(results)),
                    "eval/entropy": 1.2 - 0.5 * step / steps,
                    "eval/frac_reward_zero_std": 0.5 - 0.3 * step / steps,
                }
                store.write_eval(step, "eval", metrics, results)
    return run


def _merge(a: dict, b: dict) -> dict:
    out = dict(a)
    for key, value in b.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def _rollouts(rng: random.Random, step: int, groups: int, group_size: int, p: float) -> list[RolloutRecord]:
    records = []
    for g in range(groups):
        a, b = rng.randrange(30), rng.randrange(30)
        for c in range(group_size):
            right = rng.random() < p
            answer = str(a + b) if right else str(a + b + rng.choice((-1, 1, 10)))
            truncated = rng.random() < 0.05
            text = answer + (" and so on" * 3 if truncated else "")
            fmt = 1.0 if not truncated else 0.0
            rewards = {"correct": float(right), "format": fmt}
            records.append(
                RolloutRecord(
                    prompt_index=(step * groups + g) % 800,
                    completion_index=c,
                    prompt=f"{a}+{b}=",
                    completion=text,
                    prompt_tokens=6,
                    completion_tokens=len(text) + 1,
                    finish_reason="length" if truncated else "stop",
                    rewards=rewards,
                    reward=rewards["correct"] + 0.1 * fmt,
                    advantage=None,
                    policy_version=step - 1,
                )
            )
    _advantages(records, group_size)
    return records


def _token_values(rng: random.Random, records: list[RolloutRecord]) -> None:
    """Per-token values shaped like a real run's: one token per character and EOS, confident digits, a few tokens
    with a sampler-learner gap, and a few clipped (weight 0) where the advantage is large."""
    for r in records:
        tokens = [*r.completion, "<eos>"] if r.finish_reason == "stop" else list(r.completion)
        n = len(tokens)
        logprob = [-abs(rng.gauss(0.3, 0.6)) for _ in range(n)]
        gap = [rng.gauss(0.0, 0.02) + (rng.choice((-0.3, 0.4)) if rng.random() < 0.15 else 0.0) for _ in range(n)]
        entropy = [abs(rng.gauss(0.8, 0.5)) for _ in range(n)]
        weight = [0.0 if abs(r.advantage or 0) > 0.5 and rng.random() < 0.3 else 1.0 for _ in range(n)]
        values = {"logprob": logprob, "gap": gap, "entropy": entropy, "weight": weight}
        r.per_token = {"tokens": tokens, **{name: encode(v) for name, v in values.items()}}


def _advantages(records: list[RolloutRecord], group_size: int) -> None:
    """GRPO's: each reward minus its group's mean, over the group's standard deviation (0 where they all tie)."""
    for start in range(0, len(records), group_size):
        group = records[start : start + group_size]
        mean = sum(r.reward for r in group) / len(group)
        std = math.sqrt(sum((r.reward - mean) ** 2 for r in group) / max(len(group) - 1, 1))
        for r in group:
            r.advantage = 0.0 if std == 0 else (r.reward - mean) / (std + 1e-4)


def _metrics(rng: random.Random, step: int, steps: int, records: list[RolloutRecord], g: int) -> dict[str, float]:
    rewards = [r.reward for r in records]
    lengths = [r.completion_tokens for r in records]
    groups = [rewards[i : i + g] for i in range(0, len(rewards), g)]
    t = step / steps

    def noise(scale: float) -> float:
        return rng.gauss(0.0, scale)

    return {
        "reward": sum(rewards) / len(rewards),
        "reward_std": _std(rewards),
        "rewards/correct/mean": sum(r.rewards["correct"] for r in records) / len(records),
        "rewards/correct/std": 0.45 + noise(0.02),
        "rewards/correct/errors": 0.0,
        "rewards/format/mean": sum(r.rewards["format"] for r in records) / len(records),
        "rewards/format/std": 0.2 + noise(0.02),
        "rewards/format/errors": float(rng.random() < 0.01),
        "rewards/correct/seconds": 0.02 + abs(noise(0.005)),
        "rewards/format/seconds": 0.001 + abs(noise(0.0002)),
        "memory/peak_rss_gib": 2.1 + 0.3 * t,
        "frac_reward_zero_std": sum(max(x) == min(x) for x in groups) / len(groups),
        "completion_length/mean": sum(lengths) / len(lengths),
        "completion_length/min": float(min(lengths)),
        "completion_length/max": float(max(lengths)),
        "truncated_fraction": sum(r.finish_reason == "length" for r in records) / len(records),
        "loss": 0.05 * math.exp(-3 * t) + noise(0.01),
        "policy_loss": 0.04 * math.exp(-3 * t) + noise(0.01),
        "kl_penalty": 0.04 * 0.02 * t,
        "kl": 0.02 * t + abs(noise(0.002)),
        "beta": 0.04,
        "grad_norm": 1.0 + abs(noise(0.3)),
        "learning_rate": 1e-4 * min(1.0, step / 10),
        "entropy": 1.2 - 0.6 * t + noise(0.02),
        "completion_logprob_mean": -1.0 + 0.6 * t + noise(0.02),
        "clip_ratio/low_mean": abs(noise(0.001)),
        "clip_ratio/high_mean": abs(noise(0.002)),
        "clip_ratio/region_mean": abs(noise(0.003)),
        "advantage/mean": 0.0,
        "advantage/std": 0.9 + noise(0.05),
        "prompts_truncated": 0.0,
        "prompts_dropped": 0.0,
        "policy_staleness": 0.0,
        "time/generate": 0.8 + abs(noise(0.05)),
        "time/reward": 0.05 + abs(noise(0.005)),
        "time/logprobs": 0.2 + abs(noise(0.01)),
        "time/update": 0.5 + abs(noise(0.02)),
        "step_time": 1.6 + abs(noise(0.05)),
        "tokens_per_second": 550.0 + noise(20),
        "num_tokens": float(step * len(records) * 10),
        "nonfinite": 0.0,
    }


def _std(values: list[float]) -> float:
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / max(len(values) - 1, 1))


def _eval_prompts(rng: random.Random, skill: list[float], p: float, step: int, steps: int) -> list[dict]:
    """Each held-out prompt's 8 samples: easier prompts are learned early; a few are forgotten near the end."""
    out = []
    for i, hardness in enumerate(skill):
        chance = 1 / (1 + math.exp(hardness - 4 * (p - 0.5)))
        if i % 17 == 0 and step > 0.8 * steps:  # forgotten late in the run
            chance = 0.05
        correct = sum(rng.random() < chance for _ in range(8))
        out.append(
            {
                "prompt_index": i,
                "prompt": f"{i % 30}+{i // 30}=",
                "correct": correct,
                "samples": 8,
                "mean_reward": correct / 8 + 0.1,
            }
        )
    return out


# The Prompts view's hand-worked run (tests/unit/test_report_prompts.py works it out): {step: {prompt: rewards}}.
PROMPT_RUN = {
    1: {0: [1.0, 0.0], 1: [0.0, 0.0], 3: [0.0, 0.0]},
    2: {0: [1.0, 1.0], 2: [1.0, 1.0]},
    3: {0: [1.0, 1.0], 1: [1.0, 0.0], 2: [0.0, 1.0]},
    4: {1: [1.0, 1.0], 2: [1.0, 1.0], 3: [0.0, 0.0], 4: [1.0, 0.0]},
}


def write_prompt_run(run: Path, prompts: dict[int, str] | None = None) -> Path:
    """A run folder of :data:`PROMPT_RUN` (2 completions a prompt), its history over a window of 4 completions,
    ``data: {pool_easy_above: 0.75, retire_after: 2}``; ``prompts``: a prompt's text other than "q{index}"."""
    run.mkdir(parents=True, exist_ok=True)
    config = {"data": {"pool_easy_above": 0.75, "retire_after": 2}, "eval": {"success_threshold": 1.0}}
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    with RolloutStore(run) as store:
        store.configure_prompt_history(4, 1.0)
        for step, groups in PROMPT_RUN.items():
            records = [
                RolloutRecord(i, c, (prompts or {}).get(i, f"q{i}"), "1", 3, 1, "stop", {"r": r}, r, 0.0, step - 1)
                for i, rewards in groups.items()
                for c, r in enumerate(rewards)
            ]
            store.write_step(step, records, {"reward": sum(r.reward for r in records) / len(records)})
    return run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="run folder to create")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--groups", type=int, default=5, help="prompts per step")
    parser.add_argument("--group-size", "-G", type=int, default=10, help="completions per prompt (G)")
    parser.add_argument("--eval-every", type=int, default=25)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    write_synthetic_run(args.out, args.steps, args.groups, args.group_size, args.eval_every, seed=args.seed)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
