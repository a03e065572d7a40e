"""grpokit against TRL's GRPOTrainer on the same tiny vision-language model: seconds per GRPO step and peak memory.

Both trainers run the same steps on the same locally built model (a random-init ``Qwen2VLForConditionalGeneration``
from ``grpokit.testing.tiny_vlm``: text width 64, 2 layers, vision depth 1; a 1,000-word tokenizer carrying
Qwen2-VL's image tokens and chat template; the processor built without torchvision, ``make_processor``), float32 on
a CPU: B prompts x G = 8 completions of exactly T tokens per optimizer step (``min_new_tokens``), one image per
prompt, beta 0.04, lr 1e-6, one micro-batch. Nothing is downloaded.

    OMP_NUM_THREADS=1 python bench/vision_vs_trl.py                  # 224 px pictures (256 patches), 2 rounds
    OMP_NUM_THREADS=1 python bench/vision_vs_trl.py --image-side 28  # examples/vision's pictures (4 patches)

Each run is its own process (its peak resident memory is its own: ``ru_maxrss``, and the growth over the resident
memory when its first step starts, which leaves out the libraries each imports), with the same thread count and
environment; the configurations alternate over ``--rounds`` and the medians pool the timed steps (after one warm-up
step per run) of all rounds, so a burst of load from other processes hits both alike. Ends with ``key=value`` lines;
ratios are grpokit / TRL.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

G, WORDS = 8, [f"w{i}" for i in range(1000)]
CONFIGS = ("trl", "grpokit")


def build(workdir: Path, image_side: int) -> None:
    from grpokit.testing.tiny_vlm import build_tiny_qwen2_vl

    build_tiny_qwen2_vl(workdir / "model", words=WORDS, hidden_size=64, num_layers=2, image_side=image_side)


def rows(count: int, image_side: int) -> list[dict]:
    """Prompts as TRL's VLM tests write them: a conversational prompt with an image entry and an ``image`` column."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    prompt = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "w1 w2 w3 ?"}]}]
    pixels = [rng.integers(0, 256, size=(image_side, image_side, 3), dtype=np.uint8) for _ in range(count)]
    return [{"prompt": prompt, "image": Image.fromarray(p)} for p in pixels]


def cheap_reward(completions, **kwargs) -> list[float]:
    """Fraction of completion words whose number is even: cheap, and it varies within a group."""
    texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
    return [sum(w[-1:] in "02468" for w in t.split()) / max(len(t.split()), 1) for t in texts]


def common(args) -> dict:
    return dict(
        per_device_train_batch_size=args.prompts * G, num_generations=G, max_completion_length=args.tokens,
        generation_kwargs={"min_new_tokens": args.tokens}, beta=0.04, learning_rate=1e-6, max_steps=args.steps + 1,
        seed=0,
    )  # fmt: skip


def run_trl(args, processor) -> tuple[list[float], float]:
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    config = GRPOConfig(
        output_dir=str(args.workdir / "trl-run"), use_cpu=True, bf16=False, gradient_checkpointing=False,
        report_to="none", save_strategy="no", logging_steps=1, disable_tqdm=True, **common(args),
    )  # fmt: skip
    # TRL adds its own suppression of the image token to generation_kwargs; ours would replace it, so it is not given
    trainer = GRPOTrainer(
        model=str(args.workdir / "model"),
        reward_funcs=cheap_reward,
        args=config,
        train_dataset=Dataset.from_list(rows(args.prompts * (args.steps + 1), args.image_side)),
        processing_class=processor,
    )
    times, start_rss = [], []

    class StepClock(TrainerCallback):
        def on_step_begin(self, *a, **k):
            start_rss.append(rss_mb())
            self.t0 = time.perf_counter()

        def on_step_end(self, *a, **k):
            times.append(time.perf_counter() - self.t0)

    trainer.add_callback(StepClock())
    trainer.train()
    return times, start_rss[0]


def run_grpokit(args, processor) -> tuple[list[float], float]:
    from grpokit import GRPOConfig, GRPOTrainer

    config = GRPOConfig(
        output_dir=str(args.workdir / "grpokit-run"), overwrite=True, report_to=["jsonl"], progress_bar=False,
        save_steps=0, **common(args),
    )  # fmt: skip
    trainer = GRPOTrainer(
        model=str(args.workdir / "model"),
        reward_funcs=cheap_reward,
        args=config,
        train_dataset=rows(args.prompts * (args.steps + 1), args.image_side),
        processing_class=processor,
    )
    times, start_rss, step_fn = [], [], trainer.loop._train_step

    def timed(step):
        start_rss.append(rss_mb())
        t = time.perf_counter()
        out = step_fn(step)
        times.append(time.perf_counter() - t)
        return out

    trainer.loop._train_step = timed
    trainer.train()
    return times, start_rss[0]


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def count_patches() -> list[int]:
    """Patches through the vision tower's patch embedding in this process (a hook on every Qwen2-VL model built):
    the images each trainer sends to the tower, sampling, reference and learner passes together."""
    from transformers.models.qwen2_vl import modeling_qwen2_vl

    seen = [0]
    init = modeling_qwen2_vl.PatchEmbed.__init__

    def hooked(self, *a, **k):
        init(self, *a, **k)
        self.register_forward_hook(lambda module, inputs, output: seen.__setitem__(0, seen[0] + inputs[0].size(0)))

    modeling_qwen2_vl.PatchEmbed.__init__ = hooked
    return seen


def worker(args) -> None:
    from grpokit.models.vision import load_processor

    patches = count_patches()
    processor = load_processor(str(args.workdir / "model"))  # without torchvision: grpokit's build of it
    times, start = (run_trl if args.worker == "trl" else run_grpokit)(args, processor)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    steps = args.steps + 1
    print(json.dumps({"times": times[1:], "peak_mb": peak, "growth_mb": peak - start, "patches": patches[0] / steps}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image-side", type=int, default=224)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--steps", type=int, default=3, help="timed steps per run (after one warm-up step)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--worker", choices=CONFIGS, help=argparse.SUPPRESS)
    parser.add_argument("--workdir", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args)
    configs = args.configs.split(",")
    results: dict[str, list[dict]] = {c: [] for c in configs}
    with tempfile.TemporaryDirectory() as tmp:
        build(Path(tmp), args.image_side)
        passed = [f"--{k.replace('_', '-')}={getattr(args, k)}" for k in ("image_side", "prompts", "tokens", "steps")]
        for _ in range(args.rounds):
            for config in configs:
                cmd = [sys.executable, __file__, f"--worker={config}", f"--workdir={tmp}", *passed]
                done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "TQDM_DISABLE": "1"})
                if done.returncode != 0:
                    sys.exit(f"{config} failed:\n{done.stderr[-3000:]}")
                results[config].append(json.loads(done.stdout.strip().splitlines()[-1]))
    report(args, results)


def report(args, results: dict[str, list[dict]]) -> None:
    print(
        f"tiny Qwen2-VL, {args.image_side} px pictures, B={args.prompts} x G={G} completions of {args.tokens} tokens, "
        f"float32, {os.environ.get('OMP_NUM_THREADS', 'default')} threads, load average {os.getloadavg()[0]:.1f}"
    )
    summary = {}
    for config, runs in results.items():
        times = [t for r in runs for t in r["times"]]
        summary[config] = {
            "step_s": statistics.median(times),
            "peak_mb": statistics.median(r["peak_mb"] for r in runs),
            "growth_mb": statistics.median(r["growth_mb"] for r in runs),
            "tower_patches": statistics.median(r["patches"] for r in runs),
        }
        s = summary[config]
        print(
            f"{config:8s} {s['step_s']:.3f} s/step (median of {len(times)})  peak RSS {s['peak_mb']:.0f} MB, "
            f"{s['growth_mb']:.0f} MB above its first step's start, {s['tower_patches']:.0f} patches through the "
            "vision tower per step"
        )
    for config, s in summary.items():
        for key, value in s.items():
            print(f"{config}_{key}={value:.4f}")
    if {"trl", "grpokit"} <= set(summary):
        g, t = summary["grpokit"], summary["trl"]
        print(f"time_ratio={g['step_s'] / t['step_s']:.3f}")
        print(f"peak_memory_ratio={g['peak_mb'] / t['peak_mb']:.3f}")
        print(f"memory_growth_ratio={g['growth_mb'] / max(t['growth_mb'], 1e-9):.3f}")
        print(f"tower_patches_ratio={g['tower_patches'] / max(t['tower_patches'], 1e-9):.3f}")


if __name__ == "__main__":
    main()
