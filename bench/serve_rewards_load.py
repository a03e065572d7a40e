"""One `grpokit serve-rewards` shared by several trainers: each client (a process, as a trainer would be) sends
``--batches`` batches of ``--batch`` completions through grpokit's remote reward, ``--concurrency`` requests at a
time (``batch_size`` completions each), while the others do the same. The reward is ``judge`` below: a fixed sleep
per batch (a stand-in for a model judge or a sandbox) plus a word count.

Per client: batches scored, completions per second, the latency of a whole batch (median and 95th percentile),
the 503s it was answered (``Retry-After`` honoured: counted as retries) and the completions left without a value.
Then the server's own ``/metrics`` (requests by status, rejected, latency sum and count).

    python bench/serve_rewards_load.py [--clients 3] [--batches 20] [--batch 64] [--sleep 0.05] \\
        [--concurrency 2] [--batch-size 32] [--max-queue 16]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import subprocess
import sys
import time
import urllib.request

SLEEP_ENV = "GRPOKIT_BENCH_JUDGE_SLEEP"


def judge(completions, **kwargs) -> list[float]:
    """A stand-in for a remote judge: a fixed sleep per batch, then each completion's word count."""
    time.sleep(float(os.environ.get(SLEEP_ENV, "0.05")))
    return [float(len(str(c).split())) for c in completions]


def client(url: str, args: argparse.Namespace, ready, out) -> None:
    from grpokit.rewards.remote import RemoteReward

    reward = RemoteReward(
        url, timeout=120, retries=20, backoff=0.05, concurrency=args.concurrency, batch_size=args.batch_size
    )
    prompts = [f"prompt {i}" for i in range(args.batch)]
    completions = [" ".join(["w"] * (i % 7 + 1)) for i in range(args.batch)]
    latencies, retries, missing = [], 0, 0
    reward(prompts=prompts[:1], completions=completions[:1])  # warm-up (httpx imported, client made): not counted
    ready.wait()
    began = time.perf_counter()
    for _ in range(args.batches):
        logged: dict[str, float] = {}
        start = time.perf_counter()
        values = reward(prompts=prompts, completions=completions, log_metric=logged.__setitem__)
        latencies.append(time.perf_counter() - start)
        retries += int(logged.get("remote/retries", 0))
        missing += sum(v is None for v in values)
    wall = time.perf_counter() - began
    out.put((latencies, retries, missing, wall))


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=3)
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--batch", type=int, default=64, help="completions per batch")
    parser.add_argument("--sleep", type=float, default=0.05, help="the judge's seconds per request")
    parser.add_argument("--concurrency", type=int, default=2, help="requests in flight per client")
    parser.add_argument("--batch-size", type=int, default=32, help="completions per request")
    parser.add_argument("--max-queue", type=int, default=16, help="serve-rewards --max-queue")
    args = parser.parse_args()

    env = dict(os.environ, **{SLEEP_ENV: str(args.sleep)}, OMP_NUM_THREADS="1")
    command = [sys.executable, "-m", "grpokit.cli", "serve-rewards", f"{os.path.abspath(__file__)}:judge"]
    server = subprocess.Popen(
        [*command, "--port", "0", "--max-queue", str(args.max_queue)], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        line = server.stdout.readline()
        base = line.split(" on ")[1].split()[0]
        context = multiprocessing.get_context("spawn")
        ready, out = context.Event(), context.Queue()
        procs = [context.Process(target=client, args=(base + "/score", args, ready, out)) for _ in range(args.clients)]
        for proc in procs:
            proc.start()
        time.sleep(5.0)  # let the clients import grpokit and warm up before the clock starts for all at once
        ready.set()
        results = [out.get(timeout=3600) for _ in procs]
        for proc in procs:
            proc.join()
        metrics = urllib.request.urlopen(base + "/metrics", timeout=30).read().decode()
    finally:
        server.terminate()
        server.wait(timeout=60)

    print(
        f"{args.clients} clients x {args.batches} batches of {args.batch} completions, {args.concurrency} requests "
        f"of {args.batch_size} in flight each; judge sleeps {args.sleep:g} s per request; --max-queue {args.max_queue}"
    )
    print("\n| client | batches | completions/s | batch latency p50 (s) | p95 (s) | 503s retried | missing values |")
    print("|---|---|---|---|---|---|---|")
    for i, (latencies, retries, missing, wall) in enumerate(results):
        print(
            f"| {i + 1} | {len(latencies)} | {len(latencies) * args.batch / wall:.0f} | "
            f"{statistics.median(latencies):.3f} | {percentile(latencies, 0.95):.3f} | {retries} | {missing} |"
        )
    total = sum(len(r[0]) * args.batch for r in results) / max(r[3] for r in results)
    print(f"\nall clients: {total:.0f} completions/s")
    print("\nserver /metrics:")
    for line in metrics.splitlines():
        shown = ("grpokit_reward_requests_total", "grpokit_reward_rejected", "grpokit_reward_latency_seconds_")
        if line.startswith(shown) and "_bucket" not in line:
            print("  " + line)


if __name__ == "__main__":
    main()
