"""Where one grpokit training step spends its time, per phase and kind of op, with the matmuls' achieved GFLOP/s.

Builds a shape of bench/vs_trl.py (default ``qwen0.5b``: Qwen2.5-0.5B's config, random init, 4 prompts x 8,
one micro-batch of 32, 64 new tokens), runs one warm-up step, then one step under ``torch.profiler`` and
prints, for each phase (generate, reference log-probs, policy forward, backward, optimizer), the time of:
matmuls (with their GFLOP/s), attention, the LM head + log-softmax (``kernels/fused_head.py``; its matmuls
are counted there, not under matmuls), casts and copies, and the rest; then the phase's most expensive
ops. Last, the matmul peak of this CPU on the step's own Linear shapes in the same dtype (plain
``torch.matmul``), so the achieved rate can be read against it. It runs with the CLI's allocator (huge pages,
glibc's heap never trimmed), as the CLI's runs and bench/vs_trl.py's workers do.

    python bench/profile_step.py --layers 4           # qwen0.5b's shape with 4 of its 24 layers (~5 GB)
    python bench/profile_step.py --shape main         # the 39M model
    python bench/profile_step.py --dtype float32

The profiler adds a few % of overhead; the phase totals are wall time of the ops each phase ran.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import vs_trl  # the benchmark's model, prompts, tokenizer and reward

# the CLI's allocator (grpokit.kernels.allocator), as bench/vs_trl.py's workers: PyTorch reads this once, when it
# starts, so it is set before torch is imported; main() keeps glibc's freed memory
os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")

PHASES = ("generate", "ref_logprobs", "policy_forward", "backward", "optimizer")
MATMULS = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm"}  # the profiler counts their FLOPs
PACKED = {"mkldnn::_linear_pointwise"}  # oneDNN's packed Linear (the fused decoder): a matmul, FLOPs not counted
ATTENTION = ("scaled_dot_product", "attention", "softmax")
CASTS = {"aten::to", "aten::_to_copy", "aten::copy_", "aten::clone", "aten::contiguous", "aten::cat", "aten::empty"}


def trainer_for(workdir: Path, shape: str, dtype: str, out: Path):
    from grpokit import GRPOConfig, GRPOTrainer

    prompts, T, _, micro_batch = vs_trl.SHAPES[shape]
    rows = [json.loads(line) for line in (workdir / "prompts.jsonl").read_text().splitlines()]
    args = GRPOConfig(
        dtype=dtype,
        per_device_train_batch_size=micro_batch,
        gradient_accumulation_steps=prompts * vs_trl.G // micro_batch,
        num_generations=vs_trl.G,
        max_completion_length=T,
        beta=0.04,
        learning_rate=1e-6,
        max_steps=2,
        output_dir=str(out),
        report_to=["jsonl"],
        progress_bar=False,
        save_steps=0,
        seed=0,
    )
    return GRPOTrainer(
        model=str(workdir / "model"),
        reward_funcs=vs_trl.cheap_reward,
        args=args,
        train_dataset=rows,
        tokenizer=vs_trl.load_tokenizer(workdir),
    )


def label(fn, name: str):
    """``fn`` run inside a profiler range called ``name``."""
    from torch.profiler import record_function

    def labelled(*a, **k):
        with record_function(name):
            return fn(*a, **k)

    return labelled


@contextlib.contextmanager
def phase_labels(trainer):
    """Profiler ranges around each phase of a step (the learner's policy forward and backward included)."""
    import torch

    import grpokit.train.learning.learner as learner_module
    from grpokit.kernels import Kernels

    saved = (trainer.engine.generate, trainer.learner.reference_logprobs, trainer.learner._optimizer_step)
    forward, backward = learner_module.completion_logprobs, torch.Tensor.backward
    trainer.engine.generate = label(saved[0], "generate")
    trainer.learner.reference_logprobs = label(saved[1], "ref_logprobs")
    trainer.learner._optimizer_step = label(saved[2], "optimizer")
    head = Kernels.head_logprobs
    Kernels.head_logprobs = label(head, "FusedHead")  # the head's forward; its backward is _FusedHeadLogprobsBackward
    learner_module.completion_logprobs = label(forward, "policy_forward")
    torch.Tensor.backward = label(backward, "backward")
    try:
        yield
    finally:
        trainer.engine.generate, trainer.learner.reference_logprobs, trainer.learner._optimizer_step = saved
        learner_module.completion_logprobs, torch.Tensor.backward = forward, backward
        Kernels.head_logprobs = head


def category(name: str, in_head: bool) -> str:
    if in_head or "FusedHead" in name:
        return "lm_head"
    if name in MATMULS or name in PACKED:
        return "matmul"
    if any(a in name.lower() for a in ATTENTION):
        return "attention"
    if name in CASTS:
        return "cast/copy"
    return "other"


def summarise(prof) -> dict:
    """Per phase: total self time (s) and FLOPs by category, and self time by op name."""
    by_phase: dict = {
        p: {"cat": defaultdict(float), "flops": defaultdict(float), "ops": defaultdict(float)} for p in PHASES
    }
    roots = [e for e in prof.events() if e.name in PHASES]

    def walk(event, phase: str, in_head: bool):
        in_head = in_head or "FusedHead" in event.name
        if event.name not in PHASES:
            cat = category(event.name, in_head)
            seconds = event.self_cpu_time_total / 1e6
            by_phase[phase]["cat"][cat] += seconds
            by_phase[phase]["ops"][event.name] += seconds
            if event.name in MATMULS:
                by_phase[phase]["flops"][cat] += event.flops or 0
        for child in event.cpu_children:
            walk(child, child.name if child.name in PHASES else phase, in_head)

    for root in roots:
        if root.cpu_parent is None or root.cpu_parent.name not in PHASES:
            walk(root, root.name, False)
    return by_phase


def gflops(phase: dict, cat: str) -> float:
    """Achieved GFLOP/s of a phase's matmuls in ``cat``."""
    return phase["flops"][cat] / max(phase["cat"][cat], 1e-9) / 1e9


def matmul_peak(shapes: list[tuple[int, int, int]], dtype, seconds: float = 1.0) -> dict:
    """Best GFLOP/s of torch.matmul [m, k] x [k, n] for each shape in ``dtype``."""
    import torch

    out = {}
    for m, k, n in shapes:
        a, b = torch.randn(m, k).to(dtype), torch.randn(k, n).to(dtype)
        a @ b
        best, stop = 0.0, time.perf_counter() + seconds
        while time.perf_counter() < stop:
            t = time.perf_counter()
            a @ b
            best = max(best, 2 * m * k * n / (time.perf_counter() - t) / 1e9)
        out[(m, k, n)] = best
    return out


def peak_shapes(cfg, shape: str) -> list[tuple[int, int, int]]:
    """[m, k] x [k, n] of the step's matmuls: a micro-batch's completion tokens through each Linear, the fused
    head's backward slice and its forward chunk."""
    from grpokit.kernels.fused_head import CHUNK_ELEMENTS

    h, i, V = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size
    kv = h // cfg.num_attention_heads * cfg.num_key_value_heads
    rows = vs_trl.SHAPES[shape][3] * vs_trl.SHAPES[shape][1]
    return [
        (rows, h, i),
        (rows, i, h),
        (rows, h, h),
        (rows, h, kv),
        (rows, h, CHUNK_ELEMENTS // rows),
        (CHUNK_ELEMENTS // V, h, V),
    ]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="qwen0.5b", choices=list(vs_trl.SHAPES))
    p.add_argument("--dtype", default="auto", help="grpokit's dtype option (auto, float32, bfloat16)")
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--workdir", type=Path, help="where the model is built (default: a temp folder)")
    p.add_argument("--top", type=int, default=8, help="ops listed per phase")
    p.add_argument(
        "--layers",
        type=int,
        help="shrink the model to this many layers (the profile of the full 0.5B step does not fit "
        "in 24 GB: the profiler's events take ~10 GB more)",
    )
    a = p.parse_args()
    import torch
    from torch.profiler import ProfilerActivity, profile

    from grpokit.kernels import keep_freed_memory

    keep_freed_memory()
    torch.set_num_threads(a.threads)
    with tempfile.TemporaryDirectory() as tmp:
        workdir = a.workdir or Path(tmp)
        vs_trl.build_inputs(workdir, vs_trl.SHAPES[a.shape][2], a.layers)
        trainer = trainer_for(workdir, a.shape, a.dtype, Path(tmp) / "run")
        dtype, shapes = trainer.autocast_dtype or torch.float32, peak_shapes(trainer.model.config, a.shape)
        before = matmul_peak(shapes, dtype)
        step_fn, result = trainer.loop._train_step, {}

        def profiled_step(step):  # the first step warms up; the second runs under the profiler
            if "warm" not in result:
                result["warm"] = True
                return step_fn(step)
            with phase_labels(trainer), profile(activities=[ProfilerActivity.CPU], with_flops=True) as prof:
                t = time.perf_counter()
                result["metrics"] = step_fn(step)
                result["seconds"] = time.perf_counter() - t
            result["prof"] = prof
            return result["metrics"]

        trainer.loop._train_step = profiled_step
        trainer.train()
        prof, metrics, step = result["prof"], result["metrics"], result["seconds"]
    print(f"shape {a.shape}, compute dtype {dtype}, {a.threads} threads: step {step:.1f} s under the profiler")
    print(
        "grpokit's own phase metrics: " + ", ".join(f"{k} {v:.1f}" for k, v in metrics.items() if k.startswith("time/"))
    )
    cats = ("matmul", "attention", "lm_head", "cast/copy", "other")
    print(
        f"\n{'phase':<16}{'total s':>9}" + "".join(f"{c:>11}" for c in cats) + f"{'mm GFLOP/s':>12}{'head GFLOP/s':>14}"
    )
    summary = summarise(prof)
    for phase in PHASES:
        s = summary[phase]
        total = sum(s["cat"].values())
        print(
            f"{phase:<16}{total:>9.2f}"
            + "".join(f"{s['cat'][c]:>11.2f}" for c in cats)
            + f"{gflops(s, 'matmul'):>12.0f}{gflops(s, 'lm_head'):>14.0f}"
        )
    for phase in PHASES:
        ops = sorted(summary[phase]["ops"].items(), key=lambda kv: -kv[1])[: a.top]
        print(f"\n{phase}: " + ", ".join(f"{n} {s:.2f}" for n, s in ops))
    after = matmul_peak(shapes, dtype)
    print(f"\nmatmul peak, torch.matmul in {dtype}, [m, k] x [k, n] (best of before and after the run):")
    for m, k, n in shapes:
        print(f"  [{m}, {k}] x [{k}, {n}]: {max(before[m, k, n], after[m, k, n]):.0f} GFLOP/s")


if __name__ == "__main__":
    main()
