"""The matmuls of one decoding step at Qwen2.5-0.5B's shape, per Linear backend: time, GFLOP/s, and the same numbers.

A decoding step multiplies the rows still running (32 at the bench's shape) by every weight of the model: per layer
q/k/v fused (896 -> 1152), o (896 -> 896), gate/up fused (896 -> 9728) and down (4864 -> 896), then the LM head
(896 -> 151,936). This builds those weights (random, one set per layer, so a step streams ~2 GB of float32 weights
from memory as the real one does, not one layer's weights from cache), and times a step's matmuls alternating between
the backends the fused decoder could use, in one process:

- ``linear``: ``F.linear`` on the weight as it is ([out, in]; MKL's sgemm in float32);
- ``matmul_t``: ``x @ W^T`` with ``W^T`` stored contiguous ([in, out]), the other layout for the same sgemm;
- ``w_xt``: ``(W @ x^T)^T``, the weight as the left operand (for sgemm a tall matrix times a thin one);
- ``onednn``: the weight packed once for oneDNN (``grpokit.kernels.packed_linear``, the fused decoder's today), for
  the rows of the step; with ``--pack-rows``, also ``onednn@R``: packed for another expected row count R;
- ``mkl``: the weight packed once for MKL's packed sgemm (``torch.ops.mkl``; float32 only), what ``torch.compile``'s
  freezing uses for float32 Linears on CPU.

It prints, per backend, each kind's milliseconds per step and GFLOP/s, the step's total, its ratio to ``onednn``, and
the largest difference from ``linear``'s outputs; then the machine's matmul peak measured in the same run (a large
square float32 matmul).

    python bench/decode_matmuls.py                      # 32 rows, float32, 24 layers: ~2 min, ~8 GB
    python bench/decode_matmuls.py --rows 8 --layers 2  # a smoke run: ~10 s
    python bench/decode_matmuls.py --pack-rows 1,128    # oneDNN packed for 1 or 128 rows as well (+2 GB each)
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import defaultdict

import torch
import torch.nn.functional as F

# (kind, in features, out features) of one Qwen2.5-0.5B layer's fused Linears, then the head
LAYER = [("qkv", 896, 1152), ("o", 896, 896), ("gate_up", 896, 9728), ("down", 4864, 896)]
HEAD = ("head", 896, 151936)


def backends(weight: torch.Tensor, rows: int, pack_rows: list[int]) -> dict:
    """name -> x -> x W^T for ``weight`` [out, in], one per backend available here (``pack_rows``: the other row
    counts to pack for)."""
    from grpokit.kernels.packed_linear import pack

    transposed = weight.t().contiguous()  # [in, out]
    found = {
        "linear": lambda x, w=weight: F.linear(x, w),
        "matmul_t": lambda x, t=transposed: x @ t,
        "w_xt": lambda x, w=weight: torch.mm(w, x.t()).t(),
    }
    for hint in [rows, *pack_rows]:
        packed = pack(weight, None, weight.dtype, hint)
        if packed is not None:
            found["onednn" if hint == rows else f"onednn@{hint}"] = packed
    if torch._C.has_mkl and weight.dtype == torch.float32:
        mkl = torch.ops.mkl._mkl_reorder_linear_weight(weight, rows)
        found["mkl"] = lambda x, w=weight, p=mkl: torch.ops.mkl._mkl_linear(x, p, w, None, rows)
    return found


def peak_gflops(size: int = 2048, reps: int = 5) -> float:
    a, b = torch.randn(size, size), torch.randn(size, size)
    torch.mm(a, b)
    best = min(_timed(lambda: torch.mm(a, b)) for _ in range(reps))
    return 2 * size**3 / best / 1e9


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=32)
    p.add_argument("--layers", type=int, default=24)
    p.add_argument("--reps", type=int, default=5, help="decoding steps per backend (alternating), after a warm-up")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--pack-rows", default="", help="other expected row counts to pack for, e.g. 1,128")
    args = p.parse_args()
    pack_rows = [int(r) for r in args.pack_rows.split(",") if r.strip()]
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    shapes = [s for _ in range(args.layers) for s in LAYER] + [HEAD]
    calls = []  # (kind, in features, out features, {backend: fn})
    for kind, k, n in shapes:
        weight = torch.randn(n, k) / k**0.5
        calls.append((kind, k, n, backends(weight, args.rows, pack_rows)))
    names = list(calls[0][3])
    inputs = {k: torch.randn(args.rows, k) for k in {k for _, k, _, _ in calls}}

    # the same numbers: each backend's outputs against F.linear's
    diffs = {name: 0.0 for name in names}
    for _, k, _, fns in calls:
        expected = fns["linear"](inputs[k])
        for name, fn in fns.items():
            diffs[name] = max(diffs[name], (fn(inputs[k]) - expected).abs().max().item())

    times = {name: defaultdict(list) for name in names}  # backend -> kind -> seconds per step, one per rep
    for rep in range(args.reps + 1):
        for name in names if rep % 2 else reversed(names):  # alternate the order between reps
            per_kind = defaultdict(float)
            for kind, k, _, fns in calls:
                per_kind[kind] += _timed(lambda fn=fns[name], x=inputs[k]: fn(x))
            if rep:  # rep 0 warms up
                for kind, seconds in per_kind.items():
                    times[name][kind].append(seconds)

    flops = defaultdict(float)
    for kind, k, n, _ in calls:
        flops[kind] += 2 * args.rows * k * n
    kinds = list(dict.fromkeys(kind for kind, *_ in calls))
    print(
        f"one decoding step's matmuls: {args.rows} rows, {args.layers} layers + the head, float32, "
        f"{args.threads} threads, median of {args.reps} steps"
    )
    print(f"{'backend':11} " + " ".join(f"{kind:>18}" for kind in kinds) + f" {'step ms':>9} {'vs onednn':>9} max diff")
    total = {name: sum(statistics.median(times[name][kind]) for kind in kinds) for name in names}
    for name in names:
        cells = []
        for kind in kinds:
            seconds = statistics.median(times[name][kind])
            cells.append(f"{seconds * 1e3:8.1f} {flops[kind] / seconds / 1e9:5.0f} GF/s")
        ratio = total[name] / total["onednn"] if "onednn" in total else float("nan")
        print(f"{name:11} " + " ".join(cells) + f" {total[name] * 1e3:9.1f} {ratio:9.2f} {diffs[name]:.1e}")
    print(f"matmul peak (2048^3 float32, same run): {peak_gflops():.0f} GFLOP/s")


if __name__ == "__main__":
    main()
