"""Curricula against `uniform` on the demo's task with a deliberately wide difficulty mix (docs/curriculum.md).

The 800 training questions of ``builtin:arithmetic`` ("a+b=", 0 <= a, b <= 29) are split, with a fixed seed, into
three kinds (``--train-size N``: the first N of them):

- half *trivially easy*: any answer within ``--easy-tolerance`` (default 1) of the sum passes. The warm-started
  policy answers the sum or the sum plus one (its sloppy teacher's habit), so nearly every group of these ties at 1;
- a fifth *unsolvable*: the label is the sum plus 50, an answer the policy never writes (a mislabelled question);
- the rest (three tenths) the demo's own questions: only the sum passes.

The reward is one function, :func:`mixed_correct` (1 when the completion's first integer is within the row's
``tolerance`` of its ``answer``), with the demo's format reward at weight 0.1. The held-out set is the demo's 100 eval
questions, exact answers (tolerance 0). Each curriculum trains the demo's warm-started tiny policy (0.2 M parameters)
with the demo's settings (16 prompts x 8 completions a step, learning rate 1e-4, no warmup here) for ``--steps``
steps, evaluated every ``--eval-every`` (pass@1 over 8 samples a question, at the training temperature), once per
seed. Printed per curriculum: the steps and the training seconds (the steps' own time, evaluations left out) until
held-out pass@1 first reached ``--target`` (over the seeds that reached it), the final pass@1, and each against
`uniform` as a ratio.

    nice -n 19 env OMP_NUM_THREADS=1 python bench/curriculum.py [--steps 40] [--seeds 0 1 2] [--target 0.5]

Needs the demo's warm-started policy (``grpokit demo`` caches it; built here if missing, about 90 s).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
from pathlib import Path

CURRICULA = {
    "uniform": {},
    "learnability": {"curriculum": "learnability"},
    "pools": {"curriculum": "pools"},
    "uniform + dynamic sampling": {"dynamic_sampling": True, "max_sampling_rounds": 4},
}


def mixed_correct(prompts, completions, answer, tolerance, **columns) -> list[float]:
    """1.0 when the completion's first integer is within ``tolerance`` of ``answer``, else 0.0."""
    from grpokit.data.arithmetic import first_integer

    out = []
    for completion, expected, tol in zip(completions, answer, tolerance, strict=True):
        got = first_integer(completion)
        out.append(1.0 if got is not None and abs(got - int(expected)) <= int(tol) else 0.0)
    return out


def mixed_rows(easy_tolerance: int, size: int = 800, seed: int = 0) -> tuple[list[dict], list[dict], dict[str, int]]:
    """(train rows, eval rows, how many train rows of each kind): the module docstring's mix over the first ``size``
    training questions."""
    from grpokit.data.arithmetic import arithmetic_splits

    train, held_out = arithmetic_splits()
    train = train[:size]
    order = list(range(len(train)))
    random.Random(seed).shuffle(order)
    rank = {i: r for r, i in enumerate(order)}  # the kind by a seeded shuffle; the rows stay in the demo's order
    n_easy, n_unsolvable = len(train) // 2, len(train) // 5
    kinds: dict[str, int] = {}
    rows = []
    for i, question in enumerate(train):
        kind = "easy" if rank[i] < n_easy else "unsolvable" if rank[i] < n_easy + n_unsolvable else "demo"
        row = {**question, "tolerance": easy_tolerance if kind == "easy" else 0}
        if kind == "unsolvable":
            row["answer"] = str(int(row["answer"]) + 50)
        kinds[kind] = kinds.get(kind, 0) + 1
        rows.append(row)
    return rows, [dict(r, tolerance=0) for r in held_out], kinds


def _sum(prompt: str) -> str:
    a, b = prompt.rstrip("=").split("+")
    return str(int(a) + int(b))


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def run_one(name: str, seed: int, steps: int, eval_every: int, data: tuple[Path, Path], out: Path) -> dict:
    from grpokit.config import load_config
    from grpokit.demo import ensure_demo_policy
    from grpokit.demo.run import CONFIG_PATH
    from grpokit.demo.warmstart import single_thread
    from grpokit.trl.trainer import GRPOTrainer

    with single_thread():
        settings = {
            "model_name_or_path": str(ensure_demo_policy()),
            "output_dir": str(out),
            "train_dataset": str(data[0]),
            "eval_dataset": str(data[1]),
            "max_steps": steps,
            "warmup_steps": 0,
            "eval_steps": eval_every,
            "seed": seed,
            "report_to": ["jsonl"],
            "progress_bar": False,
            "rewards": [f"{Path(__file__).resolve()}:mixed_correct", "grpokit.data.arithmetic:arithmetic_format"],
            "reward_isolation": False,
            **CURRICULA[name],
        }
        trainer = GRPOTrainer(args=load_config(CONFIG_PATH, settings))
        started = time.perf_counter()
        trainer.train()
        wall = time.perf_counter() - started
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    step_time = {m["step"]: m["step_time"] for m in lines if "step_time" in m}
    evals = sorted((m["step"], m["eval/pass@1"]) for m in lines if "eval/pass@1" in m)
    zero = [m["curriculum/zero_variance_fraction"] for m in lines if "curriculum/zero_variance_fraction" in m]
    return {
        "curriculum": name,
        "seed": seed,
        "evals": evals,
        "train_s": [sum(t for s, t in step_time.items() if s <= step) for step, _ in evals],
        "zero_variance_fraction": statistics.mean(zero) if zero else float("nan"),
        "wall_s": wall,
    }


def to_target(run: dict, target: float) -> tuple[int, float] | None:
    """(step, training seconds) of the first evaluation with pass@1 >= target, or None."""
    for (step, pass1), seconds in zip(run["evals"], run["train_s"]):
        if pass1 >= target:
            return step, seconds
    return None


def table(runs: list[dict], target: float, seeds: int, names: list[str]) -> str:
    def summary(name: str) -> dict:
        mine = [r for r in runs if r["curriculum"] == name]
        hits = [h for h in (to_target(r, target) for r in mine) if h is not None]
        return {
            "reached": len(hits),
            "steps": statistics.mean(h[0] for h in hits) if hits else None,
            "seconds": statistics.mean(h[1] for h in hits) if hits else None,
            "final": statistics.mean(r["evals"][-1][1] for r in mine),
            "final_sd": statistics.pstdev(r["evals"][-1][1] for r in mine),
            "start": statistics.mean(r["evals"][0][1] for r in mine),
            "zero": statistics.mean(r["zero_variance_fraction"] for r in mine),
            "s_step": statistics.mean(r["train_s"][-1] / r["evals"][-1][0] for r in mine),
        }

    base = summary("uniform")
    lines = [
        f"| curriculum | reached pass@1 >= {target:g} | steps to it | vs uniform | train s to it | vs uniform "
        "| final pass@1 (sd) | vs uniform | s / step | zero-variance groups |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name in names:
        row = summary(name)
        lines.append(
            f"| {name} | {row['reached']}/{seeds} | {_number(row, 'steps')} | {_ratio(row, base, 'steps')} | "
            f"{_number(row, 'seconds')} | {_ratio(row, base, 'seconds')} | {row['start']:.3f} -> {row['final']:.3f} "
            f"({row['final_sd']:.3f}) | {_ratio(row, base, 'final')} | {row['s_step']:.2f} | {row['zero']:.2f} |"
        )
    return "\n".join(lines)


def _ratio(row: dict, base: dict, key: str) -> str:
    return f"{row[key] / base[key]:.2f}x" if row[key] and base[key] else "-"


def _number(row: dict, key: str) -> str:
    return format(row[key], ".1f") if row[key] is not None else "-"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--eval-every", type=int, default=2)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--target", type=float, default=0.8, help="held-out pass@1 to reach")
    parser.add_argument("--easy-tolerance", type=int, default=1)
    parser.add_argument("--train-size", type=int, default=800, help="training questions (the first of the 800)")
    parser.add_argument("--curricula", nargs="+", default=list(CURRICULA), choices=list(CURRICULA))
    args = parser.parse_args()
    started = time.perf_counter()
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        train, held_out, kinds = mixed_rows(args.easy_tolerance, args.train_size)
        print(f"train questions: {kinds}; held-out: {len(held_out)}", flush=True)
        data = (write_jsonl(Path(tmp) / "train.jsonl", train), write_jsonl(Path(tmp) / "eval.jsonl", held_out))
        for seed in args.seeds:
            for name in args.curricula:
                out = Path(tmp) / f"{name.replace(' ', '_')}-{seed}"
                run = run_one(name, seed, args.steps, args.eval_every, data, out)
                runs.append(run)
                print(json.dumps(run), flush=True)
    print()
    print(table(runs, args.target, len(args.seeds), args.curricula))
    print(f"\n{len(runs)} runs of {args.steps} steps in {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
