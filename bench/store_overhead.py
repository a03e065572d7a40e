"""Time RolloutStore.write_step for a realistic step; prints `store_ms_per_step=...`.

Default step: 64 rollouts (e.g. 8 prompts x G = 8) with ~1,000-character completions, 3 reward
functions and ~20 step metrics. The target is under 5 % of a training step; set the printed
number beside a measured step time (`--step-ms`) to get the ratio.

    python bench/store_overhead.py [--steps 200] [--rollouts 64] [--chars 1000] [--step-ms 2000]
"""

from __future__ import annotations

import argparse
import random
import statistics
import string
import tempfile
import time
from pathlib import Path

from grpokit.store import RolloutRecord, RolloutStore

REWARD_NAMES = ("accuracy", "format", "length")


def make_step(
    rng: random.Random, rollouts: int, chars: int, group_size: int = 8
) -> tuple[list[dict], dict[str, float]]:
    alphabet = string.ascii_letters + string.digits + "  \n.,"
    rows = []
    for i in range(rollouts):
        rewards = {name: rng.random() for name in REWARD_NAMES}
        rows.append(
            RolloutRecord(
                prompt_index=i // group_size,
                completion_index=i % group_size,
                prompt="".join(rng.choices(alphabet, k=300)),
                completion="".join(rng.choices(alphabet, k=chars)),
                prompt_tokens=80,
                completion_tokens=chars // 4,
                finish_reason=rng.choice(("stop", "length")),
                rewards=rewards,
                reward=sum(rewards.values()),
                advantage=rng.gauss(0.0, 1.0),
                policy_version=0,
                error=None,
            )
        )
    names = [
        "reward",
        "kl",
        "entropy",
        "learning_rate",
        "grad_norm",
        "completion_length/mean",
        "clip_ratio/region_mean",
        *(f"rewards/{n}/{s}" for n in REWARD_NAMES for s in ("mean", "std")),
    ]
    return rows, {name: rng.random() for name in names}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--rollouts", type=int, default=64)
    parser.add_argument("--chars", type=int, default=1000)
    parser.add_argument("--step-ms", type=float, help="a training step's time, for the ratio")
    args = parser.parse_args()

    rng = random.Random(0)
    # A few distinct steps, reused: generating random text is not what is measured.
    payloads = [make_step(rng, args.rollouts, args.chars) for _ in range(8)]
    times_ms = []
    with tempfile.TemporaryDirectory() as tmp, RolloutStore(Path(tmp) / "run") as store:
        for step in range(1, args.steps + 1):
            rows, metrics = payloads[step % len(payloads)]
            start = time.perf_counter()
            store.write_step(step, rows, metrics)
            times_ms.append((time.perf_counter() - start) * 1000)
        size_mb = store.path.stat().st_size / 1e6
    median = statistics.median(times_ms)
    p90 = statistics.quantiles(times_ms, n=10)[-1]
    # The mean includes SQLite's periodic WAL checkpoints, which the median skips.
    print(
        f"write_step: {args.steps} steps x {args.rollouts} rollouts x {args.chars} chars; "
        f"median {median:.2f} ms, mean {statistics.fmean(times_ms):.2f} ms, "
        f"p90 {p90:.2f} ms; store {size_mb:.1f} MB"
    )
    if args.step_ms:
        print(f"store_fraction_of_step={median / args.step_ms:.4f}")
    print(f"store_ms_per_step={median:.3f}")


if __name__ == "__main__":
    main()
