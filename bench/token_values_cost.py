"""What run.store_token_values costs: bytes per token in rollouts.sqlite and step time, with and without it.

Trains a small random Llama (word tokenizer, 64-token completions, G = 8, 8 prompts a step: ~4,000 completion tokens a
step) through `grpokit train` on the CPU, `--steps` steps without per-token values and `--steps` with all four,
alternating `--repeats` times, and prints the median step time of each (the first step of a run left out), their
ratio, the bytes per stored token: the table's payload (the tokens' text and the float16 values) and the growth
of the store file per token, and the time recording a step's values adds, timed alone (attach_token_values and the
store's write: the step-time medians carry a shared machine's noise).

    python bench/token_values_cost.py [--steps 12] [--repeats 2] [--completion 64] [--hidden 256]
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import statistics
import tempfile
from pathlib import Path

import yaml

from grpokit.cli import main as grpokit
from grpokit.testing import build_tiny_causal_lm, build_word_tokenizer

WORDS = [f"w{i}" for i in range(200)]


def train(tmp: Path, model: Path, name: str, args: argparse.Namespace, values: list[str]) -> Path:
    data = tmp / "train.jsonl"
    if not data.exists():
        data.write_text("".join(json.dumps({"prompt": " ".join(WORDS[i : i + 8])}) + "\n" for i in range(150)))
    config = {
        "model": {"model_name_or_path": str(model)},
        "data": {"train_dataset": str(data)},
        "algo": {"num_generations": 8, "beta": 0.0},
        "generation": {"max_completion_length": args.completion},
        "optim": {"learning_rate": 1e-5, "per_device_train_batch_size": 64, "max_steps": args.steps},
        "run": {
            "output_dir": str(tmp / name),
            "progress_bar": False,
            "report_to": ["jsonl"],
            "save_strategy": "no",
            "store_token_values": values,
        },
        "rewards": [{"name": "format", "pattern": "w1.*"}],
    }
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    assert grpokit(["train", str(path)]) == 0
    return tmp / name


def step_times(run: Path) -> list[float]:
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [line["step_time"] for line in lines if "step_time" in line][1:]


def store_bytes(run: Path) -> tuple[int, int, int]:
    """(the store file's bytes after a WAL checkpoint, the token_values payload's bytes, completion tokens)."""
    path = run / "rollouts.sqlite"
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        tokens = conn.execute("SELECT sum(completion_tokens) FROM rollouts").fetchone()[0]
        payload = conn.execute(
            "SELECT coalesce(sum(length(tokens) + coalesce(length(logprob), 0) + coalesce(length(gap), 0) + "
            "coalesce(length(entropy), 0) + coalesce(length(weight), 0)), 0) FROM token_values"
        ).fetchone()[0]
    return path.stat().st_size, payload, tokens


def record_cost(tokenizer, completion: int, repeats: int = 20) -> tuple[float, float]:
    """(ms to record and store a step of 64 completions of ``completion`` tokens without per-token values, the ms
    added with all four): ``attach_token_values`` and ``RolloutStore.write_step`` timed alone, the median of
    ``repeats``; what the step-time medians above measure through the noise of a shared machine."""
    import time

    import torch

    from grpokit.rollout.types import Rollouts
    from grpokit.store import RolloutRecord, RolloutStore
    from grpokit.train.experience.trajectory import Trajectory
    from grpokit.train.token_record import attach_token_values

    n, names = 64, ("logprob", "gap", "entropy", "weight")
    rollouts = Rollouts(
        prompt_ids=[[1]] * 8,
        completion_ids=torch.randint(4, len(WORDS), (n, completion)),
        completion_mask=torch.ones(n, completion),
        logprobs=-torch.rand(n, completion),
        finish_reasons=["length"] * n,
        num_generations=8,
    )
    sampled = Trajectory(list(range(8)), rollouts, ["x"] * n, None)
    kept = {name: torch.randn(n, completion) for name in ("logprob", "entropy", "weight")}

    def records() -> list:
        return [RolloutRecord(i // 8, i % 8, "p", "c" * 200, 8, completion, "length", {"r": 1.0}, 1.0, 0.0, 0)
                for i in range(n)]  # fmt: skip

    times: dict[bool, list[float]] = {False: [], True: []}
    with tempfile.TemporaryDirectory() as tmp, RolloutStore(Path(tmp) / "run") as store:
        for step in range(1, 2 * repeats + 1):
            with_values = step % 2 == 0
            start = time.perf_counter()
            rows = records()
            if with_values:
                attach_token_values(rows, sampled, kept, names, tokenizer)
            store.write_step(step, rows, {})
            times[with_values].append((time.perf_counter() - start) * 1000)
    without, with_ = statistics.median(times[False]), statistics.median(times[True])
    return without, with_ - without


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--completion", type=int, default=64, help="max_completion_length")
    parser.add_argument("--hidden", type=int, default=256, help="the model's hidden size (4 layers)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        model = tmp / "model"
        tokenizer = build_word_tokenizer(WORDS)
        build_tiny_causal_lm(model, tokenizer, hidden_size=args.hidden, num_layers=4, num_heads=4)
        times: dict[str, list[float]] = {"without": [], "with": []}
        sizes = {}
        for r in range(args.repeats):
            for kind, values in (("without", []), ("with", ["all"])):
                run = train(tmp, model, f"{kind}-{r}", args, values)
                times[kind] += step_times(run)
                sizes[kind] = store_bytes(run)
        (file_without, _, tokens_without), (file_with, payload, tokens_with) = sizes["without"], sizes["with"]
        record_ms, added_ms = record_cost(tokenizer, args.completion)
    median = {kind: statistics.median(t) for kind, t in times.items()}
    print(f"completion_tokens_per_step={tokens_with / args.steps:.0f}")
    print(f"step_seconds_without={median['without']:.4f}")
    print(f"step_seconds_with={median['with']:.4f}")
    print(f"step_time_ratio={median['with'] / median['without']:.4f}")
    print(f"payload_bytes_per_token={payload / tokens_with:.2f}")
    growth = file_with / tokens_with - file_without / tokens_without
    print(f"store_bytes_per_token_without={file_without / tokens_without:.1f}")
    print(f"store_bytes_per_token_added={growth:.1f}")
    print(f"record_ms_per_step_without={record_ms:.1f}")
    print(f"record_ms_per_step_added={added_ms:.1f}")
    print(f"added_fraction_of_step={added_ms / 1000 / median['without']:.4f}")


if __name__ == "__main__":
    main()
