"""grpokit's steps one by one at a bench shape: time, page faults and glibc's heap per step.

``vs_trl.py`` reports the median of its timed steps. This prints every step, so the allocator's behaviour over
steps shows: how far the heap grows, whether glibc trims it again, and the page faults each growth costs. It runs
``vs_trl.py``'s grpokit worker in this process, with the CLI's allocator settings (``grpokit.kernels.allocator``:
glibc's heap kept, PyTorch's transparent huge pages) and one of its configurations.

    python bench/heap_steps.py --shape qwen0.5b --steps 4                                  # ~10 min, ~15 GB
    python bench/heap_steps.py --shape qwen0.5b --steps 4 --config grpokit_trim_1gib       # the CLI's before 11-28
    THP_MEM_ALLOC_ENABLE=0 python bench/heap_steps.py --shape qwen0.5b --steps 4           # without huge pages
    python bench/heap_steps.py --shape main --layers 1 --steps 3                           # a smoke run: ~1 min

PyTorch reads ``THP_MEM_ALLOC_ENABLE`` once, when it starts, so this sets it (1 unless given, then the
configuration's own) before importing torch.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

import vs_trl  # the benchmark's models, prompts, shapes and grpokit worker


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", default="qwen0.5b", choices=list(vs_trl.SHAPES))
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--layers", type=int, help="shrink the shape's model to this many layers")
    p.add_argument("--threads", type=int, default=2)
    names = [c for c, v in vs_trl.CONFIGS.items() if v["impl"] == "grpokit"]
    p.add_argument("--config", default="grpokit", choices=names, help="a grpokit configuration of vs_trl.py")
    args = p.parse_args()
    os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")  # as the grpokit command and vs_trl.py's workers
    os.environ.update(vs_trl.CONFIGS[args.config].get("env", {}))

    import torch

    torch.set_num_threads(args.threads)
    prompts, completion_length, model, micro_batch = vs_trl.SHAPES[args.shape]
    with tempfile.TemporaryDirectory() as tmp:
        vs_trl.build_inputs(Path(tmp), model, args.layers)
        settings = vs_trl.CONFIGS[args.config]
        records = vs_trl.run_grpokit(
            Path(tmp), settings, prompts, completion_length, micro_batch, args.steps, Path(tmp) / "run"
        )
    for n, r in enumerate(records, 1):
        print(
            f"step {n}: {r['step_time']:.2f} s, {r['minor_faults']:,} page faults, "
            f"peak RSS so far {r['peak_rss_mb_so_far']:,.0f} MB"
        )
        print(
            "  heap, MB in use at most / heap size: "
            + ", ".join(f"{phase} {used:,.0f} / {size:,.0f}" for phase, (used, size) in r["heap_peaks"].items())
        )


if __name__ == "__main__":
    main()
