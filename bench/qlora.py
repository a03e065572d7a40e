"""Full fine-tuning, LoRA and QLoRA on the benchmark model of bench/vs_trl.py: peak memory and step time.

Each method trains in its own process (so its peak resident memory is its own), on the same locally built model
(~39M parameters, 16.4M of them the tied embedding / LM head, which QLoRA leaves unquantised), prompts and cheap
reward as vs_trl.py, with grpokit's defaults (dtype auto: bf16 autocast on a CPU with native bf16), beta 0.04:

    full    every weight trains (a frozen reference copy for the KL term)
    lora    r 16 adapters on every Linear, the base frozen (the reference is the base, adapters off)
    qlora   the same adapters on a base whose Linear layers are 4-bit NF4 (load_in_4bit)

Step time is the median of the timed steps (the first step of each run is a warm-up). Then, for sampling with
a 4-bit base, two ways are timed on the same prompts: the 4-bit layers through the HF forward (what grpokit does)
against dequantising every 4-bit weight once and decoding through the fused decoder on the dequantised copy
(its dequantisation time included).

    python bench/qlora.py                                   # 4 prompts x 8 completions of 64 tokens, 1 + 3 steps
    python bench/qlora.py --prompts 2 --completion-length 32 --steps 3    # lighter
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import vs_trl  # the benchmark model, prompts, tokenizer, reward and grpokit worker

METHODS = {"full": {"lora": {"r": 0}}, "lora": {"lora": {"r": 16}}, "qlora": {"lora": {"r": 16}, "load_in_4bit": True}}


def train(workdir: Path, method: str, prompts: int, completion_length: int, steps: int) -> dict:
    """One method's run in this process (vs_trl.py's grpokit worker with the method's settings): step times and the
    process's peak RSS."""
    settings = {"impl": "grpokit", "dtype": "auto", "options": METHODS[method]}
    with tempfile.TemporaryDirectory(dir=workdir) as out:
        records = vs_trl.run_grpokit(workdir, settings, prompts, completion_length, vs_trl.G, steps, Path(out) / "run")
    return {
        "step_times": [r["step_time"] for r in records],
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def sampling(workdir: Path, prompts: int, completion_length: int, repeats: int) -> dict:
    """Seconds to sample prompts x G completions from the 4-bit base: HF forward vs dequantise once + fused decoder."""
    import torch
    from bitsandbytes.functional import dequantize_4bit
    from bitsandbytes.nn import Linear4bit

    from grpokit.models.loading import load_model
    from grpokit.rollout.engine import HFRolloutEngine
    from grpokit.rollout.types import SamplingParams

    cpu = torch.device("cpu")
    tokenizer = vs_trl.load_tokenizer(workdir)
    rows = [json.loads(line) for line in (workdir / "prompts.jsonl").read_text().splitlines()][:prompts]
    ids = [tokenizer(r["prompt"], add_special_tokens=False)["input_ids"] for r in rows]
    params = SamplingParams.plain(completion_length)
    four_bit = load_model(str(workdir / "model"), torch.float32, cpu, load_in_4bit=True)
    plain = load_model(str(workdir / "model"), torch.float32, cpu)  # receives the dequantised weights
    plain_linears = dict(plain.named_modules())

    def dequantise_into_plain():
        with torch.no_grad():
            for name, module in four_bit.named_modules():
                if isinstance(module, Linear4bit):
                    plain_linears[name].weight.copy_(dequantize_4bit(module.weight.data, module.weight.quant_state))

    def hf_forward():
        HFRolloutEngine(four_bit, [tokenizer.eos_token_id], tokenizer.pad_token_id, cpu).generate(ids, vs_trl.G, params)

    def dequantised_fused():
        dequantise_into_plain()
        HFRolloutEngine(plain, [tokenizer.eos_token_id], tokenizer.pad_token_id, cpu).generate(ids, vs_trl.G, params)

    def timed(fn) -> float:
        fn()  # warm-up (the fused decoder's one-time check against the HF forward included)
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        return statistics.median(times)

    start = time.perf_counter()
    dequantise_into_plain()
    dequantise = time.perf_counter() - start
    return {"hf_forward": timed(hf_forward), "dequantised_fused": timed(dequantised_fused), "dequantise": dequantise}


def run_worker(workdir: Path, threads: int, *worker_args: str) -> dict:
    cmd = [sys.executable, __file__, "--worker", str(workdir), str(threads), *worker_args]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-6000:])
        raise SystemExit(f"{' '.join(worker_args)} failed with exit code {proc.returncode}")
    return json.loads(lines[-1][len("RESULT ") :])


def worker(argv: list[str]) -> None:
    import torch

    workdir, threads, task, *rest = argv
    torch.set_num_threads(int(threads))
    if task == "sampling":
        result = sampling(Path(workdir), *map(int, rest))
    else:
        result = train(Path(workdir), task, *map(int, rest))
    print("RESULT " + json.dumps(result), flush=True)


def main() -> None:
    if sys.argv[1:2] == ["--worker"]:
        return worker(sys.argv[2:])
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=4, help="prompts per optimizer step (x G = 8 completions)")
    parser.add_argument("--completion-length", type=int, default=64)
    parser.add_argument("--steps", type=int, default=4, help="steps per run, the first a warm-up")
    parser.add_argument("--sampling-repeats", type=int, default=3, help="timed generations per sampling way (0: skip)")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    shape = [str(args.prompts), str(args.completion_length)]
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        vs_trl.build_inputs(workdir)
        print(
            f"{args.prompts} prompts x {vs_trl.G} completions of up to {args.completion_length} tokens, "
            f"{args.steps} steps (1 warm-up), {args.threads} threads"
        )
        print(f"{'method':>6} {'peak RSS MiB':>13} {'step s':>7} {'RSS / full':>11} {'time / full':>12}")
        results = {}
        for method in METHODS:
            r = run_worker(workdir, args.threads, method, *shape, str(args.steps))
            results[method] = (r["peak_rss_mb"], statistics.median(r["step_times"][1:]))
            rss, step = results[method]
            full_rss, full_step = results["full"]
            print(
                f"{method:>6} {rss:>13.0f} {step:>7.2f} {rss / full_rss:>11.2f} {step / full_step:>12.2f}", flush=True
            )
        if args.sampling_repeats:
            s = run_worker(workdir, args.threads, "sampling", *shape, str(args.sampling_repeats))
            print(
                f"sampling from the 4-bit base: HF forward {s['hf_forward']:.2f} s, dequantise once + fused decoder "
                f"{s['dequantised_fused']:.2f} s (of which dequantising {s['dequantise']:.2f} s); "
                f"ratio dequantised / HF forward = {s['dequantised_fused'] / s['hf_forward']:.2f}"
            )


if __name__ == "__main__":
    main()
