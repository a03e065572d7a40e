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

``--vllm-partial S`` measures partial rollouts instead (in the vLLM environment, with Ray): for each K of ``--ks``
(>= 1), a run sampled by one vLLM Ray rollout worker without partial rollouts and one with
``vllm_partial_rollout_tokens: S``, on a tiny random Llama (word tokenizer, 44 tokens) whose completions end at EOS
after a geometric number of tokens (mean about 30 at ``--max-length 64``, a fifth of them cut at it): long and short
mixed. The reward (the fraction of "w7" words, after the same sleep per call) teaches nothing this model can show in
a held-out pass@1 within a few steps, so the table has speed and staleness only (mean token staleness: each token's
updates between the policy that sampled it and the one trained on it, ``policy_staleness_token_mean``). Seconds per
step and the learner's idle share leave out the first step, which also waits for the worker's start.

    OMP_NUM_THREADS=1 VLLM_CPU_CI_ENV=1 .venv-vllm/bin/python bench/async_staleness.py --vllm-partial 16 --ks 1 2

``--server`` (with ``--vllm-partial``): the same against a ``grpokit vllm-serve`` of the model (float32, eager, one
loopback port, started here) instead of a Ray worker; the table adds the weight pushes per step.
"""

from __future__ import annotations

import argparse
import contextlib
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


def slow_target(prompts, completions, target, **columns) -> list[float]:
    """The fraction of each completion's words that are ``target``, after a fixed sleep per call (the batch's)."""
    import os

    time.sleep(float(os.environ.get("GRPOKIT_BENCH_SLEEP", SLEEP_SECONDS)))
    return [c.split().count(t) / max(1, len(c.split())) for c, t in zip(completions, target)]


def tiny_vllm_model(folder: Path) -> Path:
    """A tiny random Llama vLLM's CPU build runs (head_dim 32) with a 40-word tokenizer, saved to ``folder``."""
    from grpokit.testing import VLLM_HEAD_DIM, build_tiny_causal_lm, build_word_tokenizer

    words = [f"w{i}" for i in range(40)]
    build_tiny_causal_lm(
        folder, build_word_tokenizer(words), arch="llama", num_heads=2, head_dim=VLLM_HEAD_DIM, max_positions=128
    )
    return folder


@contextlib.contextmanager
def vllm_server(model: Path, log: Path):
    """A ``grpokit vllm-serve`` of ``model`` on a free loopback port (float32, eager): its URL; killed after."""
    import os
    import signal
    import socket
    import subprocess
    import sys

    import httpx

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    args = ["--port", str(port), "--dtype", "float32", "--enforce-eager", "--max-model-len", "128"]
    command = [sys.executable, "-m", "grpokit.cli", "vllm-serve", str(model), *args]
    with open(log, "w") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            url, deadline = f"http://127.0.0.1:{port}", time.monotonic() + 900  # a start on a busy 2-core machine
            while time.monotonic() < deadline and proc.poll() is None:
                with contextlib.suppress(httpx.HTTPError):
                    if httpx.get(url + "/health", timeout=5).status_code == 200:
                        break
                time.sleep(1)
            else:
                raise RuntimeError(f"grpokit vllm-serve did not start; see {log}")
            yield url
        finally:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def run_vllm(
    k: int, partial: int | None, steps: int, max_length: int, model: Path, out: Path, server: str | None = None
) -> dict:
    """One run with a vLLM Ray rollout worker (or the vLLM server at ``server``) at max_staleness ``k``, with partial
    rollouts after ``partial`` tokens or without (None)."""
    import sqlite3

    from grpokit import GRPOConfig, GRPOTrainer

    rows = [{"prompt": " ".join(f"w{j}" for j in range(i, i + 4)), "target": "w7"} for i in range(32)]
    where = (
        dict(backend="ray", num_rollout_workers=1, rollout_worker_cpus=1, ray_num_cpus=2, vllm_kv_cache_gib=0.25)
        if server is None
        else dict(vllm_mode="server", vllm_server_base_url=server, vllm_server_timeout=600)
    )
    args = GRPOConfig(
        engine="vllm",
        **where,
        max_staleness=k,
        vllm_partial_rollout_tokens=partial,
        off_policy_correction="decoupled_ppo",
        scoring_threads=k + 1,
        reward_isolation=False,
        num_generations=4,
        per_device_train_batch_size=32,
        max_completion_length=max_length,
        max_steps=steps,
        learning_rate=1e-3,
        lr_scheduler_type="constant",
        dtype="float32",
        device="cpu",
        output_dir=str(out),
        report_to=["jsonl"],
        progress_bar=False,
        save_steps=0,
    )
    trainer = GRPOTrainer(str(model), f"{Path(__file__).resolve()}:slow_target", args=args, train_dataset=rows)
    started = time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - started
    trained = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    trained = [m for m in trained if "step_time" in m]
    with sqlite3.connect(out / "rollouts.sqlite") as db:
        lengths, continued = db.execute(
            "SELECT avg(completion_tokens), avg(token_versions IS NOT NULL) FROM rollouts"
        ).fetchone()
    steady = trained[1:]  # the first step also waits for the worker's start (Ray's actor, vLLM's engine)
    waited = [m.get("time/generate", 0.0) + m.get("time/reward", 0.0) for m in steady]
    return {
        "k": k,
        "partial": partial,
        "step_s": statistics.mean(m["step_time"] for m in steady),
        "idle_fraction": sum(waited) / sum(m["step_time"] for m in steady),
        "staleness_mean": statistics.mean(m["policy_staleness"] for m in trained),
        "token_staleness_mean": statistics.mean(m["policy_staleness_token_mean"] for m in trained),
        "length_mean": lengths,
        "continued_fraction": continued,
        "pushes_per_step": trained[-1].get("vllm_server_pushes", float("nan")) / len(trained),
        "wall_s": wall,
    }


def vllm_partial_table(args) -> None:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        model = tiny_vllm_model(Path(tmp) / "model")
        with vllm_server(model, Path(tmp) / "server.log") if args.server else contextlib.nullcontext() as url:
            for k in args.ks:
                for partial in (None, args.vllm_partial):
                    out = Path(tmp) / f"k{k}-{partial}"
                    rows.append(run_vllm(k, partial, args.steps, args.max_length, model, out, url))
                    print(json.dumps(rows[-1]), flush=True)
    print()
    print("| K | partial rollouts | s / step | learner idle | staleness | token staleness | continued | mean length |"
          + (" pushes / step |" if args.server else ""))  # fmt: skip
    print("|---|---|---|---|---|---|---|---|" + ("---|" if args.server else ""))
    for row in rows:
        label = "off" if row["partial"] is None else f"after {row['partial']} tokens"
        print(
            f"| {row['k']} | {label} | {row['step_s']:.2f} | {row['idle_fraction']:.0%} | "
            f"{row['staleness_mean']:.2f} | {row['token_staleness_mean']:.2f} | {row['continued_fraction']:.0%} | "
            f"{row['length_mean']:.1f} |" + (f" {row['pushes_per_step']:.2f} |" if args.server else "")
        )


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
    parser.add_argument("--vllm-partial", type=int, metavar="S", help="partial rollouts against none (module doc)")
    parser.add_argument("--max-length", type=int, default=64, help="--vllm-partial: max_completion_length")
    parser.add_argument("--server", action="store_true", help="--vllm-partial: a vLLM server, not a Ray worker")
    args = parser.parse_args()
    import os

    os.environ["GRPOKIT_BENCH_SLEEP"] = str(args.sleep)
    if args.vllm_partial is not None:
        vllm_partial_table(args)
        return
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
