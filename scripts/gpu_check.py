"""The GPU check: what grpokit's tests only check on CPU stand-ins, run once on a real GPU, with a JSON of the figures.

    python scripts/gpu_check.py --out gpu_check.json        # on one CUDA GPU: under 8 minutes
    python scripts/gpu_check.py --dry-run --out dry.json    # on a CPU, small sizes (CI runs this)

Parts, each in its own process with its own timeout (a hung CUDA call cannot stall the rest), in this order:

- ``precision``: A/B of float32 weights + autocast (grpokit's rule) against bf16 weights: 10 AdamW steps at lr 1e-6
  on an 896x896 Linear; the fraction of weights that changed and the dtypes of AdamW's moments.
- ``collectives``: a one-rank process group as torchrun makes it (``cpu:gloo,cuda:nccl`` with ``device_id``) running
  every collective the trainer makes, on CPU and CUDA tensors.
- ``train_hf`` / ``train_vllm``: two training steps of GRPOTrainer on a small random-init Qwen2 with each engine
  (vllm where installed): the time of a step and the peak GPU memory.
- ``vllm``: vLLM's own checks (sleep/wake, log-prob gap, bf16 vs fp32 throughput, LoRA sync drift), from the module
  the vLLM work adds (:func:`vllm_checks`); "missing" where vLLM is not installed, skipped where that module is absent.

A part whose package is missing says so (``status: missing``) and the others run. ``--dry-run`` runs every part on
the CPU with small sizes, gloo in NCCL's place, and no timing worth reading: it checks that the script works.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# seconds per part on one GPU; their sum (420 s) plus start-up stays under 8 minutes
TIMEOUTS = {"precision": 60, "collectives": 60, "train_hf": 120, "train_vllm": 90, "vllm": 90}
VLLM_MODULE = "grpokit.testing.vllm_gpu_check"  # added by the vLLM work: run(device, dry_run) -> dict


def part_precision(dry_run: bool) -> dict:
    """Fraction of weights changed after 10 AdamW steps at lr 1e-6: float32 weights under autocast vs bf16 weights."""
    import torch

    from grpokit.machine.precision import choose_precision

    device = torch.device("cpu" if dry_run else "cuda")
    compute = torch.bfloat16 if dry_run else choose_precision("auto", device).compute
    size = 128 if dry_run else 896
    out = {"device": str(device), "compute_dtype": str(compute).removeprefix("torch."), "size": size}
    for name, weights, autocast in (("fp32_autocast", torch.float32, compute), ("bf16_weights", torch.bfloat16, None)):
        torch.manual_seed(0)
        layer = torch.nn.Linear(size, size, bias=False).to(device=device, dtype=weights)
        before = layer.weight.detach().clone()
        optimizer = torch.optim.AdamW(layer.parameters(), lr=1e-6, weight_decay=0.0)
        for _ in range(10):
            x = torch.randn(32, size, device=device, dtype=weights)
            with torch.autocast(device.type, dtype=autocast, enabled=autocast is not None):
                loss = layer(x).float().pow(2).mean()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
        state = optimizer.state[layer.weight]
        out[name] = {
            "weights_dtype": str(layer.weight.dtype).removeprefix("torch."),
            "fraction_changed": float((layer.weight.detach() != before).float().mean()),
            "moment_dtypes": sorted({str(state[k].dtype).removeprefix("torch.") for k in ("exp_avg", "exp_avg_sq")}),
        }
    return out


def part_collectives(dry_run: bool) -> dict:
    """Every collective of a training step on a one-rank group built as torchrun's ranks build it."""
    import torch
    import torch.distributed as dist

    from grpokit.distributed.torch_dist import DistContext, process_group_backend
    from grpokit.train.learning.accelerator import gather_ragged

    class OneRank(DistContext):
        enabled = property(lambda self: True)  # a one-rank context would skip its collectives

    cuda = not dry_run
    backend = process_group_backend(True, gpu_backend="gloo" if dry_run else "nccl")
    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group(
            backend,
            init_method=f"file://{tmp}/pg",
            rank=0,
            world_size=1,
            device_id=torch.device("cuda", 0) if cuda else None,
        )
        try:
            procs, ran = OneRank(), []
            devices = [torch.device("cpu")] + ([torch.device("cuda", 0)] if cuda else [])
            for device in devices:
                procs.gather(torch.ones(3, device=device))
                procs.sum(torch.tensor(2.0, device=device))
                gather_ragged(procs, torch.arange(2.0, device=device))
                ran += [f"gather/{device.type}", f"sum/{device.type}", f"gather_ragged/{device.type}"]
            procs.mean_metrics({"loss": 1.0})  # float64 CPU
            procs.gather_objects({"rank": 0})
            procs.barrier()
            ran += ["mean_metrics/cpu-float64", "gather_objects", "barrier"]
        finally:
            dist.destroy_process_group()
    return {"backend": backend, "ran": ran}


def part_train(engine: str, dry_run: bool) -> dict:
    """Two GRPOTrainer steps with ``engine`` on a small random-init Qwen2: seconds per step, peak GPU memory."""
    import torch

    from grpokit import GRPOConfig, GRPOTrainer
    from grpokit.testing import VLLM_HEAD_DIM, build_tiny_causal_lm, build_word_tokenizer

    if engine == "vllm":
        import vllm  # noqa: F401  (missing: reported by the caller)
    hidden, layers = (32, 1) if dry_run else (512, 4)
    # the dry run's heads (32 / 4 = 8 wide) are too narrow for vLLM's CPU attention: widen them to VLLM_HEAD_DIM
    head_dim = VLLM_HEAD_DIM if engine == "vllm" and dry_run else None
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer = build_word_tokenizer([f"w{i}" for i in range(200)])
        build_tiny_causal_lm(
            tmp, tokenizer, arch="qwen2", hidden_size=hidden, num_layers=layers, num_heads=4, head_dim=head_dim
        )
        rows = [{"prompt": f"w{i} w{i + 1} w{i + 2}"} for i in range(16)]
        args = GRPOConfig(
            output_dir=f"{tmp}/run",
            max_steps=2,
            learning_rate=1e-6,
            num_generations=4,
            per_device_train_batch_size=8,
            max_completion_length=8 if dry_run else 64,
            device="cpu" if dry_run else "cuda",
            engine=engine,
            report_to="none",
            save_strategy="no",
            eval_strategy="no",
        )
        reward = lambda completions, **kw: [float(len(set(c.split()))) for c in completions]
        trainer = GRPOTrainer(model=tmp, processing_class=tokenizer, reward_funcs=reward, args=args, train_dataset=rows)
        if not dry_run:
            torch.cuda.reset_peak_memory_stats()
        start = time.perf_counter()
        trainer.train()
        seconds = time.perf_counter() - start
        return {
            "engine": engine,
            "steps": 2,
            "seconds_per_step": seconds / 2,
            "peak_gpu_memory_gib": None if dry_run else torch.cuda.max_memory_allocated() / 2**30,
            "weights_dtype": str(next(trainer.model.parameters()).dtype).removeprefix("torch."),
            "autocast_dtype": str(trainer.autocast_dtype).removeprefix("torch."),
        }


def vllm_checks(dry_run: bool) -> dict:
    """vLLM's part of the check (sleep/wake cycles, log-prob gap, bf16 vs fp32 tokens/s, LoRA sync drift), owned by
    the vLLM work: ``grpokit.testing.vllm_gpu_check.run(device=..., dry_run=...) -> dict``. Missing where vLLM is
    not installed, skipped where that module is absent, each with the reason."""
    import importlib
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        return {
            "status": "missing",
            "package": "vllm",
            "reason": "vllm is not installed (pip install 'grpokit[vllm]' on a CUDA machine)",
        }
    try:
        module = importlib.import_module(VLLM_MODULE)
    except ModuleNotFoundError as exc:
        if exc.name not in (VLLM_MODULE, VLLM_MODULE.rsplit(".", 1)[0]):
            raise
        return {"status": "skipped", "reason": f"{VLLM_MODULE} is not in this checkout (the vLLM work adds it)"}
    return module.run(device="cpu" if dry_run else "cuda", dry_run=dry_run)


PARTS = {
    "precision": part_precision,
    "collectives": part_collectives,
    "train_hf": lambda dry_run: part_train("hf", dry_run),
    "train_vllm": lambda dry_run: part_train("vllm", dry_run),
    "vllm": vllm_checks,
}


def run_part(name: str, dry_run: bool) -> dict:
    """One part in this process: its figures, or why it could not run."""
    try:
        result = PARTS[name](dry_run)
    except ModuleNotFoundError as exc:
        return {"status": "missing", "package": exc.name, "reason": f"{exc.name} is not installed: part skipped"}
    except Exception as exc:
        return {
            "status": "failed",
            "error": f"{type(exc).__name__}: {exc}",
            "traceback": traceback.format_exc()[-3000:],
        }
    return result if "status" in result else {"status": "ok", **result}


def in_child(name: str, dry_run: bool, timeout: float) -> dict:
    """``name`` run by a fresh interpreter, killed after ``timeout`` seconds."""
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        cmd = [sys.executable, __file__, "--part", name, "--out", out.name] + (["--dry-run"] if dry_run else [])
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
        start = time.perf_counter()
        try:
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return {"status": "timeout", "timeout_s": timeout}
        seconds = round(time.perf_counter() - start, 1)
        text = Path(out.name).read_text()
        if proc.returncode != 0 or not text:
            return {
                "status": "failed",
                "returncode": proc.returncode,
                "stderr": proc.stderr[-3000:],
                "seconds": seconds,
            }
        return json.loads(text) | {"seconds": seconds}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="grpokit's GPU check (see the module docstring).")
    parser.add_argument("--out", default="gpu_check.json", help="where the JSON is written")
    parser.add_argument("--dry-run", action="store_true", help="on the CPU, small sizes: checks the script itself")
    parser.add_argument("--part", choices=sorted(PARTS), help="run one part in this process (the parent's call)")
    parser.add_argument("--only", nargs="*", choices=sorted(PARTS), help="run these parts only")
    a = parser.parse_args(argv)
    if a.part:
        Path(a.out).write_text(json.dumps(run_part(a.part, a.dry_run), indent=2))
        return 0
    if not a.dry_run:
        import torch

        if not torch.cuda.is_available():
            print("gpu_check: no CUDA GPU visible; run it on a GPU machine, or --dry-run here.", file=sys.stderr)
            return 2
    report = {"dry_run": a.dry_run, "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "parts": {}}
    for name in a.only or PARTS:
        timeout = TIMEOUTS[name] * (3 if a.dry_run else 1)  # a busy CI CPU is slower than a GPU, not stuck
        result = in_child(name, a.dry_run, timeout)
        report["parts"][name] = result
        print(f"gpu_check: {name}: {result['status']}" + (f" ({result.get('reason')})" if "reason" in result else ""))
    Path(a.out).write_text(json.dumps(report, indent=2))
    print(f"gpu_check: wrote {a.out}")
    return 0 if all(p["status"] in ("ok", "skipped", "missing") for p in report["parts"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
