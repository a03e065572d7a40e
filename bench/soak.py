"""A long run that must stay flat: a tiny model (built here, random weights) trained for ``--steps`` steps with
evaluation (``--eval-steps``), checkpoints (``--save-steps``, the last 2 kept), the rollout store and a remote
reward served by ``grpokit serve-rewards`` (a subprocess) beside a local one. Every ``--every`` steps it samples this
process: resident memory, open file descriptors, OS threads, child processes (recursive), the store's size on disk
and the mean step time since the last sample.

After warm-up (the first ``--warmup`` fraction of the samples) it checks, and prints with the table:

- descriptors, threads and children: neither their floor nor their ceiling rises from the first half of the samples
  to the second (synchronous runs show the same count at every sample; with ``--max-staleness`` the producer may be
  scoring when a sample is taken, so a remote request's thread, timer and socket come and go, and a leak shows as a
  floor that rises);
- resident memory: grows less than ``--rss-bound-mb`` from the first sample after warm-up to the last;
- the store: grows linearly, its bytes per step in the second half of the run within 0.5x-2x of the first half's;
- step time: the last quarter's median within 2x of the first post-warm-up quarter's (printed, a figure to read:
  the machine is shared).

Exit status 1 when a check fails. ``--max-staleness K`` samples ahead (K >= 1; without Ray on a background thread
with the hf engine), ``--ray`` with Ray rollout workers.

    python bench/soak.py [--steps 2000] [--every 50] [--max-staleness 0] [--ray]

:func:`soak` is also run short by tests/integration/test_soak_counts.py, which asserts the counts only.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

WORDS = [f"w{i}" for i in range(40)]
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }} : {{ m['content'] }} {% endfor %}"
    "{% if add_generation_prompt %}assistant :{% endif %}"
)


def target_fraction(completions, target, **kwargs) -> list[float]:
    """The fraction of a completion's words that are its row's target word."""
    out = []
    for text, word in zip(completions, target):
        words = str(text).split()
        out.append(sum(w == word for w in words) / len(words) if words else 0.0)
    return out


@dataclass
class Sample:
    step: int
    rss_mb: float
    fds: int
    threads: int
    children: int
    store_mb: float
    step_s: float


def _os_threads() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("Threads:"))


def _children() -> int:
    """This process's descendants, found in /proc (a parent chain that reaches us)."""
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parents[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):  # gone meanwhile
                continue
    me, count = os.getpid(), 0
    for pid in parents:
        seen, p = 0, parents.get(pid)
        while p is not None and p > 1 and seen < 64:
            if p == me:
                count += 1
                break
            p, seen = parents.get(p), seen + 1
    return count


def _store_mb(run: Path) -> float:
    """The store's logical size (pages in use, its write-ahead log's included), read on a connection of its own:
    the files' sizes move in steps of the log's checkpoints. (SQLite keeps that connection's descriptor open after
    the first close while the trainer's connection holds locks on the file: one more descriptor from the second
    sample on, constant, inside the warm-up.)"""
    import sqlite3

    path = run / "rollouts.sqlite"
    if not path.exists():
        return 0.0
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=60)
    try:
        pages, size, free = (
            db.execute(f"PRAGMA {p}").fetchone()[0] for p in ("page_count", "page_size", "freelist_count")
        )
    finally:
        db.close()
    return (pages - free) * size / 2**20


def sample(step: int, run: Path, step_s: float) -> Sample:
    with open("/proc/self/statm") as f:
        rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    return Sample(step, rss, len(os.listdir("/proc/self/fd")), _os_threads(), _children(), _store_mb(run), step_s)


def _sampler(run: Path, every: int, samples: list[Sample]):
    from transformers import TrainerCallback

    class Sampler(TrainerCallback):
        def __init__(self):
            self.last = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step % every == 0:
                now = time.perf_counter()
                samples.append(sample(state.global_step, run, (now - self.last) / every))
                self.last = now

    return Sampler()


def write_inputs(folder: Path) -> tuple[Path, Path, Path]:
    """A tiny model, train and eval sets; (model folder, train.jsonl, eval.jsonl)."""
    import json

    from grpokit.testing import build_tiny_causal_lm, build_word_tokenizer

    model = folder / "tiny-llama"
    tokenizer = build_word_tokenizer([*WORDS, "user", "assistant", "system", ":"])
    tokenizer.chat_template = CHAT_TEMPLATE
    build_tiny_causal_lm(model, tokenizer, arch="llama", hidden_size=32, num_layers=2, num_heads=2)
    rows = [{"prompt": " ".join(WORDS[i : i + 4]), "target": f"w{i % 10}"} for i in range(36)]
    train, evals = folder / "train.jsonl", folder / "eval.jsonl"
    train.write_text("".join(json.dumps(r) + "\n" for r in rows[:32]))
    evals.write_text("".join(json.dumps(r) + "\n" for r in rows[32:]))
    return model, train, evals


class RewardServer:
    """``grpokit serve-rewards`` of :func:`target_fraction` in a subprocess on a free loopback port."""

    def __init__(self):
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path), OMP_NUM_THREADS="1")
        spec = f"{Path(__file__).resolve()}:target_fraction"
        command = [sys.executable, "-m", "grpokit.cli", "serve-rewards", spec, "--port", "0"]
        self.proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
        line = self.proc.stdout.readline()
        if "serving rewards" not in line:
            raise RuntimeError(f"serve-rewards did not start: {line!r}")
        self.url = line.split(" on ")[1].split()[0] + "/score"

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=120)


def soak(
    folder: Path,
    steps: int,
    every: int,
    eval_steps: int,
    save_steps: int,
    max_staleness: int = 0,
    ray: bool = False,
) -> list[Sample]:
    """Train as the module docstring says in ``folder``; the samples taken every ``every`` steps."""
    from grpokit.config import load_config
    from grpokit.trl.trainer import GRPOTrainer

    model, train, evals = write_inputs(folder)
    run = folder / "run"
    server = RewardServer()
    samples: list[Sample] = []
    try:
        settings = {
            "model_name_or_path": str(model),
            "train_dataset": str(train),
            "eval_dataset": str(evals),
            "output_dir": str(run),
            "num_generations": 4,
            "beta": 0.0,
            "max_completion_length": 4,
            "per_device_train_batch_size": 8,
            "max_steps": steps,
            "eval_steps": eval_steps,
            "num_generations_eval": 2,
            "pass_at_k": [1],
            "save_steps": save_steps,
            "save_total_limit": 2,
            "report_to": ["jsonl"],
            "progress_bar": False,
            "logging_steps": 1000,
            "rewards": [
                f"{Path(__file__).resolve()}:target_fraction",
                {"url": server.url, "format": "grpokit", "retries": 1, "timeout": 30, "weight": 0.5},
            ],
        }
        if max_staleness:
            settings["max_staleness"] = max_staleness
        if ray:  # one rollout worker in a local cluster of 2 CPUs
            settings.update(backend="ray", num_rollout_workers=1, ray_num_cpus=2, rollout_worker_cpus=1.0)
        trainer = GRPOTrainer(args=load_config(None, settings), callbacks=[_sampler(run, every, samples)])
        trainer.train()
    finally:
        server.close()
    return samples


def verdict(samples: list[Sample], warmup: float, rss_bound_mb: float) -> list[str]:
    """The failed checks (module docstring), as lines; empty when flat."""
    after = samples[max(1, int(len(samples) * warmup)) :]
    if len(after) < 4:
        return [f"too few samples after warm-up ({len(after)}): run more steps or sample more often"]
    failed = []
    half = len(after) // 2
    for name in ("fds", "threads", "children"):
        values = [getattr(s, name) for s in after]
        early, late = values[:half], values[half:]
        if min(late) > min(early) or max(late) > max(early):
            failed.append(f"{name} grew after warm-up: {values}")
    growth = after[-1].rss_mb - after[0].rss_mb
    if growth > rss_bound_mb:
        failed.append(f"resident memory grew {growth:.1f} MB after warm-up (bound {rss_bound_mb:g} MB)")
    first = (after[half].store_mb - after[0].store_mb) / (after[half].step - after[0].step)
    second = (after[-1].store_mb - after[half].store_mb) / (after[-1].step - after[half].step)
    if first > 0 and not 0.5 <= second / first <= 2.0:
        failed.append(f"the store grew {first * 1024:.2f} KB/step, then {second * 1024:.2f} KB/step: not linear")
    return failed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--every", type=int, default=50)
    parser.add_argument("--eval-steps", type=int, default=250)
    parser.add_argument("--save-steps", type=int, default=250)
    parser.add_argument("--max-staleness", type=int, default=0)
    parser.add_argument("--ray", action="store_true", help="Ray rollout workers (backend: ray)")
    parser.add_argument("--warmup", type=float, default=0.2, help="fraction of the samples left out of the checks")
    parser.add_argument("--rss-bound-mb", type=float, default=50.0)
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    began = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        samples = soak(
            Path(tmp), args.steps, args.every, args.eval_steps, args.save_steps, args.max_staleness, args.ray
        )
    wall = time.perf_counter() - began
    print(f"\n{args.steps} steps in {wall / 60:.1f} min; max_staleness {args.max_staleness}; ray {args.ray}")
    print("\n| step | RSS (MB) | open fds | threads | children | store (MB) | s/step |")
    print("|---|---|---|---|---|---|---|")
    for s in samples:
        print(
            f"| {s.step} | {s.rss_mb:.0f} | {s.fds} | {s.threads} | {s.children} | {s.store_mb:.2f} | {s.step_s:.3f} |"
        )
    after = samples[max(1, int(len(samples) * args.warmup)) :]
    quarter = max(1, len(after) // 4)
    early, late = (statistics.median(s.step_s for s in part) for part in (after[:quarter], after[-quarter:]))
    print(f"\nstep time after warm-up: first quarter median {early:.3f} s, last quarter {late:.3f} s")
    failed = verdict(samples, args.warmup, args.rss_bound_mb)
    print("flat: every check passed" if not failed else "NOT FLAT:\n" + "\n".join(failed))
    print({k: v for k, v in asdict(samples[-1]).items()}, "threads alive here:", threading.active_count())
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
