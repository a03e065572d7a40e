"""`grpokit demo`: the offline CPU demo (GRPO teaches a small model arithmetic)."""

from __future__ import annotations

from grpokit.commands.running import keep_freed_memory_on_cpu, quietly


def register(sub) -> None:
    p = sub.add_parser("demo", help="offline CPU demo: teach a small model arithmetic with GRPO")
    p.add_argument("--output-dir", default="runs/demo", help="the run folder (default: runs/demo)")
    p.add_argument("--steps", type=int, default=None, help="GRPO steps (default: the example config's)")
    p.add_argument("--rebuild", action="store_true", help="rebuild the cached warm-start policy")
    p.set_defaults(func=quietly(run_demo))


def run_demo(args) -> int:
    from grpokit.demo import run_demo

    keep_freed_memory_on_cpu("auto")  # the demo's config leaves the device to auto
    result = run_demo(output_dir=args.output_dir, steps=args.steps, rebuild=args.rebuild)
    for key in ("pass1_before", "pass1_after", "pass8_before", "pass8_after", "wall_seconds"):
        print(f"{key}={result[key]:.4f}")  # machine-readable, one key=value per line
    return 0
