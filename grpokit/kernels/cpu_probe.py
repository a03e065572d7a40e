"""Timing this CPU's compute paths on a model's own matmul shapes: the measurements behind ``mixed_precision: auto``
on a CPU (:mod:`grpokit.kernels.cpu_precision` chooses from them, says why, and caches them).

A CPU flag says that an instruction exists, not that it is fast: on a 2-core Intel VM with AVX512-BF16 but no AMX,
a bf16 matmul ran at 77 GFLOP/s against float32's 120; on an AMD EPYC with AVX512-BF16 bf16 reached 862. So each
path is timed here as the run would use it:

- learning (fat matmuls: a micro-batch's tokens): ``F.linear`` forward and backward with float32 weights, in float32
  and under bf16 autocast (which casts the weights on every call; the cast is part of the cost). fp16 is not a
  learning candidate on a CPU: grpokit's CPU learner has no loss scale, and fp16 gradients underflow without one.
- sampling (thin matmuls: one row per sequence still decoding): float32 and bf16 on weights cast once and packed
  for oneDNN where this CPU packs that dtype (:meth:`grpokit.machine.cpu_caps.CpuCaps.packs`, the fused decoder's path,
  :mod:`grpokit.kernels.packed_linear`), else ``F.linear`` on the cast weights; fp16 (``F.linear``, weights cast
  once) where the CPU has AVX512-FP16.

bf16 is a candidate only where oneDNN has bf16 kernels (``CpuCaps.onednn_bf16``; elsewhere torch emulates it), so
``GRPOKIT_CPU_CAPS=avx2`` (:mod:`grpokit.machine.cpu_caps`) leaves float32 alone, unmeasured.

Each path is timed on one thread: the choice reads the ratio between the dtypes, which holds per core, while a
multi-threaded timing on a busy machine measures OpenMP threads waiting for each other's core (on this project's
2-core VM at a load average of 8, two threads timed float32 learning at 4-14 GFLOP/s and bf16 at 2-22, in any order;
one thread gave 92-106 and 159-161, bf16 ahead every time, as the benchmark's steps were). The rates are per core.

The shapes are the model's ``nn.Linear`` layers (projections, MLP, head), the :data:`MAX_SHAPES` costliest distinct
ones, each dimension cut to :data:`MAX_DIM` (a 152k-column head is timed on 1,024 columns) so that the whole probe
stays well under a second; the rate of a cut shape stands for the whole one.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from grpokit.machine.cpu_caps import CpuCaps

MAX_DIM = 1024  # a timed matmul's in and out features at most
MAX_SHAPES = 6  # distinct Linear shapes timed, the costliest first
LEARN_ROWS = 128  # rows of a timed learning matmul (a chunk of a micro-batch's tokens, cut for time)
MAX_SAMPLE_ROWS = 256
TRIALS = 3  # timed calls per path and shape after a warm-up; the fastest counts (others' load only slows)
BUDGET_S = 0.25  # per phase: after it, each path keeps the trials it has (at least one)
DTYPES = {"float32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class Shape:
    """``count`` Linear layers of ``in_features`` -> ``out_features``."""

    in_features: int
    out_features: int
    count: int = 1

    @property
    def timed(self) -> tuple[int, int]:
        """The (in, out) features actually timed: each cut to MAX_DIM."""
        return min(self.in_features, MAX_DIM), min(self.out_features, MAX_DIM)


def matmul_shapes(model: torch.nn.Module) -> list[Shape]:
    """The model's distinct ``nn.Linear`` shapes with their counts, the MAX_SHAPES costliest (count x in x out)
    first. Works on a meta-device model (only the shapes are read)."""
    counts = Counter(
        (m.in_features, m.out_features) for m in model.modules() if isinstance(m, torch.nn.Linear)
    )  # a tied LM head is a Linear too
    shapes = [Shape(k, n, c) for (k, n), c in counts.items()]
    shapes.sort(key=lambda s: (-s.count * s.in_features * s.out_features, s.in_features, s.out_features))
    return shapes[:MAX_SHAPES]


def reference_shapes() -> list[Shape]:
    """A Qwen2.5-0.5B-shaped model's (24 layers, hidden 896, 2 KV heads of 64, MLP 4864, vocabulary 151,936):
    what ``grpokit env`` measures when no model is given."""
    h, kv, mlp, layers = 896, 128, 4864, 24
    head = Shape(h, 151_936)  # tied: one Linear
    return [head, Shape(h, mlp, 2 * layers), Shape(mlp, h, layers), Shape(h, h, 2 * layers), Shape(h, kv, 2 * layers)]


def candidates(caps: CpuCaps) -> tuple[list[str], list[str]]:
    """(learning candidates, sampling candidates) on this CPU (module docstring); float32 is always first."""
    bf16 = caps.x86 and caps.onednn_bf16  # elsewhere bf16 matmuls are emulated or never measured
    learning = ["float32"] + (["bf16"] if bf16 else [])
    sampling = learning + (["fp16"] if caps.x86 and "avx512_fp16" in caps.flags else [])
    return learning, sampling


def effective_rate(shapes: list[Shape], seconds_per_gflop: list[float]) -> float:
    """GFLOP/s over the model's matmuls: sum of each shape's FLOPs / sum of their times, each shape weighted by
    ``count * in * out`` (its FLOPs per row) and timed at ``seconds_per_gflop`` (1 / its measured rate)."""
    work = [s.count * s.in_features * s.out_features for s in shapes]
    return sum(work) / sum(w * t for w, t in zip(work, seconds_per_gflop))


def _learning_call(path: str, k: int, n: int, rows: int) -> tuple[Callable[[], object], float]:
    x = torch.randn(rows, k, requires_grad=True)
    w = torch.randn(n, k, requires_grad=True)  # float32 master weights, as the learner's
    dtype = DTYPES[path]
    grad = torch.ones(rows, n, dtype=dtype)

    def call():
        with torch.autocast("cpu", dtype=dtype, enabled=dtype != torch.float32):
            y = F.linear(x, w)
        return torch.autograd.grad(y, (x, w), grad)

    return call, 3 * 2 * rows * k * n / 1e9  # forward, and the backward's two matmuls


def _sampling_call(path: str, k: int, n: int, rows: int, caps: CpuCaps) -> tuple[Callable[[], object], float]:
    dtype = DTYPES[path]
    w = torch.randn(n, k).to(dtype)
    x = torch.randn(rows, k).to(dtype)
    packed = None
    if caps.packs(dtype):
        from grpokit.kernels.packed_linear import pack

        packed = pack(w, None, dtype, rows)  # None when oneDNN refuses it here: F.linear, as sampling would

    def call():
        with torch.no_grad():
            return packed(x) if packed is not None else F.linear(x, w)

    return call, 2 * rows * k * n / 1e9


def _time(calls: dict, budget_s: float) -> dict:
    """Fastest seconds per call for each key of ``calls`` ({key: callable}), the keys interleaved trial by trial
    so that a burst of load elsewhere slows every path alike; a warm-up call each first."""
    for call in calls.values():
        call()
    best = dict.fromkeys(calls, float("inf"))
    start = time.perf_counter()
    for trial in range(TRIALS):
        if trial and time.perf_counter() - start > budget_s:
            break
        for key, call in calls.items():
            t0 = time.perf_counter()
            call()
            best[key] = min(best[key], time.perf_counter() - t0)
    return best


def measure(
    shapes: list[Shape], caps: CpuCaps, learn_rows: int = LEARN_ROWS, sample_rows: int = 32
) -> dict[str, dict[str, float]]:
    """Measured GFLOP/s: ``{"learning": {path: rate}, "sampling": {path: rate}}`` for this CPU's candidates
    (:func:`candidates`) over ``shapes``. Raises what torch raises when a path cannot run."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # per core: see the module docstring
    try:
        with torch.random.fork_rng(devices=[]):  # a seeded run draws the same numbers whether the probe ran or not
            return _measure(shapes, caps, learn_rows, sample_rows)
    finally:
        torch.set_num_threads(threads)


def _measure(shapes: list[Shape], caps: CpuCaps, learn_rows: int, sample_rows: int) -> dict[str, dict[str, float]]:
    learning, sampling = candidates(caps)
    sample_rows = max(1, min(sample_rows, MAX_SAMPLE_ROWS))
    out = {}
    for phase, paths in (("learning", learning), ("sampling", sampling)):
        calls, gflops = {}, {}
        for path in paths:
            for i, shape in enumerate(shapes):
                k, n = shape.timed
                made = (
                    _learning_call(path, k, n, learn_rows)
                    if phase == "learning"
                    else _sampling_call(path, k, n, sample_rows, caps)
                )
                calls[path, i], gflops[path, i] = made
        seconds = _time(calls, BUDGET_S)
        out[phase] = {
            path: effective_rate(shapes, [seconds[path, i] / gflops[path, i] for i in range(len(shapes))])
            for path in paths
        }
    return out
