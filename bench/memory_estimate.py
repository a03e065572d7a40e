"""`grpokit explain`'s memory estimate against the peak resident memory of real runs.

On the model of bench/vs_trl.py (built locally, no download), each setting trains 3 steps in its own
process (peak memory is per process), and prints the estimate of its tensors (grpokit/memory/estimate.py),
the measured peak RSS, and the difference: what the process adds (runtime, allocator).

    python bench/memory_estimate.py        # LoRA row: peft, QLoRA row: bitsandbytes (pip install 'grpokit[qlora]')
    python bench/memory_estimate.py 5 6    # only these rows (1-based)
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import vs_trl  # the benchmark model, prompts, tokenizer and reward

# (per_device_train_batch_size, gradient_accumulation_steps, dtype, max_completion_length, LoRA rank, 4-bit)
SETTINGS = [
    (8, 4, "auto", 64, 0, False),
    (4, 8, "auto", 64, 0, False),
    (16, 2, "auto", 64, 0, False),
    (8, 4, "float32", 64, 0, False),
    (8, 2, "auto", 256, 0, False),
    (8, 4, "auto", 64, 16, False),
    (8, 1, "auto", 32, 16, True),  # QLoRA: one prompt of 8 completions per step, 4-bit layers are slow on CPU
]


def config(workdir: Path, mb: int, accumulation: int, dtype: str, T: int, lora_rank: int, four_bit: bool, out: str):
    from grpokit import GRPOConfig

    return GRPOConfig(
        model_name_or_path=str(workdir / "model"),
        dtype=dtype,
        per_device_train_batch_size=mb,
        gradient_accumulation_steps=accumulation,
        num_generations=vs_trl.G,
        max_completion_length=T,
        max_prompt_length=vs_trl.PROMPT_TOKENS,
        beta=0.04,
        learning_rate=1e-6,
        max_steps=3,
        output_dir=out,
        report_to=["jsonl"],
        progress_bar=False,
        save_steps=0,
        seed=0,
        lora={"r": lora_rank},
        load_in_4bit=four_bit,
    )


def worker(workdir: Path, setting: list) -> None:
    import torch

    from grpokit import GRPOTrainer
    from grpokit.kernels import keep_freed_memory

    keep_freed_memory()  # measured as `grpokit train` runs
    torch.set_num_threads(2)
    rows = [json.loads(line) for line in (workdir / "prompts.jsonl").read_text().splitlines()]
    with tempfile.TemporaryDirectory(dir=workdir) as out:
        trainer = GRPOTrainer(
            reward_funcs=vs_trl.cheap_reward,
            args=config(workdir, *setting, out=out + "/run"),
            train_dataset=rows,
            tokenizer=vs_trl.load_tokenizer(workdir),
        )
        trainer.train()
    print("RESULT", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)


def main() -> None:
    if sys.argv[1:2] == ["--worker"]:
        return worker(Path(sys.argv[2]), json.loads(sys.argv[3]))
    from grpokit.compose.memory import estimate_memory
    from grpokit.memory.shape import build_meta_model

    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        vs_trl.build_inputs(workdir)
        rows = [SETTINGS[int(i) - 1] for i in sys.argv[1:]] or SETTINGS
        print(
            f"{'micro-batch':>11} {'accum':>5} {'dtype':>8} {'T':>4} {'LoRA r':>6} {'4-bit':>5} {'estimate MiB':>13} "
            f"{'peak RSS MiB':>13} {'difference':>11}"
        )
        for setting in rows:
            cfg = config(workdir, *setting, out=str(workdir / "run"))
            estimate = estimate_memory(cfg, build_meta_model(cfg.model_name_or_path)).peak / 2**20
            proc = subprocess.run(
                [sys.executable, __file__, "--worker", str(workdir), json.dumps(setting)],
                capture_output=True,
                text=True,
                check=True,
            )
            rss = int(proc.stdout.split("RESULT")[-1]) / 2**20
            mb, accumulation, dtype, T, rank, four_bit = setting
            print(
                f"{mb:>11} {accumulation:>5} {dtype:>8} {T:>4} {rank:>6} {four_bit!s:>5} {estimate:>13.0f}"
                f" {rss:>13.0f} {rss - estimate:>11.0f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
