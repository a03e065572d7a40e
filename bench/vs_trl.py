"""grpokit against TRL's GRPOTrainer: step time, phases, peak memory and MFU on one model and config.

Both trainers run the same GRPO steps on the same locally built model (random-init Qwen2-style,
hidden 512, 8 layers, 8 heads / 2 KV heads, MLP 1408, vocabulary 32,000, tied embeddings: ~39M
parameters), word-level tokenizer, 512 prompts of 32 tokens and a cheap reward: B prompts x G = 8
completions per optimizer step (micro-batches of 8), beta 0.04, num_iterations 1, lr 1e-6, CPU.
Nothing is downloaded.

    pip install trl psutil            # the bench extra: pip install 'grpokit[bench]'
    python bench/vs_trl.py            # 2 rounds x (1 warm-up + 3 timed steps) per config, both shapes
    python bench/vs_trl.py --quick    # 1 round x (1 warm-up + 2 timed steps), main shape only
    python bench/vs_trl.py --shapes qwen0.5b   # Qwen2.5-0.5B's shape: 1 round x (1 warm-up + 2 timed steps)

Configurations: TRL out of the box (bf16 autocast, gradient checkpointing on), TRL bf16 without
checkpointing, TRL float32 without checkpointing, grpokit out of the box, grpokit float32, grpokit bf16 autocast
(where the CPU has native bf16 matmul); and, only when
named in ``--configs``, grpokit's memory options (gradient checkpointing, the 8-bit AdamW, the reference stored in
bf16 under autocast and in a float32 run) and grpokit with ``algorithm: ppo`` (``grpokit_ppo``: the same steps plus
the critic's values pass and training step; the ratio to ``grpokit`` is the critic's cost), and four allocator
settings against the CLI's (``grpokit_no_thp``: without PyTorch's transparent huge pages; ``grpokit_trim_1gib``: the
CLI's setting before 2026-11-28, glibc's heap trimmed above 1 GiB free and no huge pages; ``grpokit_thp_trim_1gib``:
huge pages with that trim; ``grpokit_thp_mmap_32mb``: blocks >= 32 MB mmapped and handed back on free).
``CONFIG@COMMIT`` (e.g. ``grpokit@8aed0b9``) runs a grpokit configuration on the grpokit package as it was at a
commit of this repository (exported with ``git archive`` into the work folder, first on the worker's PYTHONPATH),
so the code before a change runs in the same rounds as the code after it.
Shapes: ``main`` (4 prompts x 8, 64 completion tokens) and ``long`` (2 prompts x 8, 256 tokens) on the
model above; ``qwen0.5b``: Qwen2.5-0.5B's config (hidden 896, 24 layers, 14 heads / 2 KV heads, MLP 4864,
vocabulary 151,936, tied embeddings: 494M parameters), random init, 4 prompts x 8 in one micro-batch of 32,
64 completion tokens. By default it runs TRL out of the box, TRL without checkpointing in float32 and, where the
CPU has native bf16 matmul (per ``grpokit.machine.cpu_caps``), in bf16, the faster of them being TRL's anchor,
and grpokit out of the box: TRL peaks at ~20 GB there, so leave the machine to it. The report prints grpokit's
compute choice (``mixed_precision: auto``: measured, ``grpokit/kernels/cpu_precision.py``) with its reason, and
each precision's time
(``grpokit_fp32``, ``grpokit_bf16`` on the small model), so a wrong choice shows as a ratio. ``--layers N`` shrinks a
shape's model to N layers (a quick check that every configuration runs; not a benchmark figure).

Each run is its own process (so its peak resident memory is its own) with the same thread count
and environment. Runs are interleaved in rounds (every config once per round) and the medians pool
the timed steps of all rounds, so a burst of load from other processes hits both libraries alike.
Workers get OMP_WAIT_POLICY=passive (both libraries): on a shared VM, OpenMP threads that spin
between parallel regions lose a whole scheduler time slice (~8 ms here) per region whenever another
process holds a core, which turns each small op into milliseconds; ``--omp-wait-policy default``
measures without it.

MFU counts the FLOPs a step needs, not the ones an implementation happens to spend: a forward
pass is 2 x (N_body x body tokens + N_head x completion tokens), with body tokens = each prompt once
(its G completions share it) + the completion tokens, N_body the non-embedding weights and N_head
the tied LM head (vocab x hidden); training is 3 forward passes. The attention score and value
matmuls (< 3 % here) are left out, so MFU is slightly understated. The peak is the best large
matmul of this CPU measured in the same run (before and after the configurations), in a worker
with the same settings.

Ends with ``key=value`` lines; ratios are grpokit / TRL.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import math
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

NUM_PROMPTS, PROMPT_TOKENS, G = 512, 32, 8

MODELS = {  # name -> Qwen2Config fields
    "bench": dict(
        vocab_size=32_000,
        hidden_size=512,
        num_hidden_layers=8,
        num_attention_heads=8,
        num_key_value_heads=2,
        intermediate_size=1408,
        max_position_embeddings=1024,
    ),
    "qwen0.5b": dict(  # Qwen/Qwen2.5-0.5B's config.json
        vocab_size=151_936,
        hidden_size=896,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        intermediate_size=4864,
        max_position_embeddings=32_768,
        max_window_layers=24,
        rms_norm_eps=1e-6,
        rope_theta=1_000_000.0,
        sliding_window=32_768,
        use_sliding_window=False,
    ),
}

SHAPES = {  # name -> (prompts per step, max_completion_length, model, completions per micro-batch)
    "main": (4, 64, "bench", G),
    "long": (2, 256, "bench", G),
    "qwen0.5b": (4, 64, "qwen0.5b", 4 * G),
}

CONFIGS = {  # name -> worker settings
    "trl_default": {"impl": "trl", "bf16": True, "checkpointing": True},
    "trl_bf16": {"impl": "trl", "bf16": True, "checkpointing": False},
    "trl_fp32": {"impl": "trl", "bf16": False, "checkpointing": False},
    "grpokit": {"impl": "grpokit", "dtype": "auto"},
    "grpokit_fp32": {"impl": "grpokit", "dtype": "float32"},
    # grpokit with bf16 autocast forced (mixed_precision: bf16): the alternative to the measured choice where the CPU
    # has bf16; with grpokit_fp32, a wrong choice of grpokit's shows as a ratio
    "grpokit_bf16": {"impl": "grpokit", "dtype": "auto", "options": {"mixed_precision": "bf16"}},
    # not run by default: grpokit's memory options, for --configs (checkpointing: with TRL's layout, no shared prompt)
    "grpokit_checkpointing": {"impl": "grpokit", "dtype": "auto", "checkpointing": True},
    "grpokit_adamw_8bit": {"impl": "grpokit", "dtype": "auto", "options": {"optimizer": "adamw_8bit"}},
    "grpokit_ref_bf16": {"impl": "grpokit", "dtype": "auto", "options": {"ref_model_dtype": "bfloat16"}},
    "grpokit_fp32_ref_bf16": {"impl": "grpokit", "dtype": "float32", "options": {"ref_model_dtype": "bfloat16"}},
    # the micro-batch's forward and backward in one pass (the default when the run fits), or in passes of 8 or 4 rows
    "grpokit_rows_8": {"impl": "grpokit", "dtype": "auto", "options": {"backward_chunk_rows": 8}},
    "grpokit_rows_4": {"impl": "grpokit", "dtype": "auto", "options": {"backward_chunk_rows": 4}},
    # one kernel turned to its plain version (same numbers): its effect in one run
    "grpokit_no_lean_mlp": {"impl": "grpokit", "dtype": "auto", "plain_kernels": ["lean_mlp"]},
    "grpokit_no_lean_norm": {"impl": "grpokit", "dtype": "auto", "plain_kernels": ["lean_norm"]},
    # the allocator, not run by default. grpokit's workers run as its CLI does: glibc's heap never trimmed, no mmap
    # (keep_freed_memory) and PyTorch's transparent huge pages for tensors >= 2 MB (THP_MEM_ALLOC_ENABLE=1, read once
    # at start-up: worker_env). Against that: without the huge pages; the CLI's setting before 2026-11-28 (no huge
    # pages, the heap trimmed above 1 GiB free at its top); huge pages with that trim; huge pages with glibc's mmap for
    # blocks >= 32 MB, handed back on free
    "grpokit_no_thp": {"impl": "grpokit", "dtype": "auto", "env": {"THP_MEM_ALLOC_ENABLE": "0"}},
    "grpokit_trim_1gib": {
        "impl": "grpokit",
        "dtype": "auto",
        "env": {"THP_MEM_ALLOC_ENABLE": "0"},
        "mallopt": {"M_TRIM_THRESHOLD": 2**30},
    },
    "grpokit_thp_trim_1gib": {"impl": "grpokit", "dtype": "auto", "mallopt": {"M_TRIM_THRESHOLD": 2**30}},
    "grpokit_thp_mmap_32mb": {
        "impl": "grpokit",
        "dtype": "auto",
        "mallopt": {"M_MMAP_MAX": 65536, "M_MMAP_THRESHOLD": 32 << 20},
    },
    # not run by default: the same steps with PPO (algorithm: ppo), whose extra cost is the critic, for --configs
    "grpokit_ppo": {"impl": "grpokit", "dtype": "auto", "options": {"algorithm": "ppo"}},
}
MEMORY_OPTIONS = ["grpokit_checkpointing", "grpokit_adamw_8bit", "grpokit_ref_bf16", "grpokit_fp32_ref_bf16"]
ALLOCATOR_OPTIONS = ["grpokit_no_thp", "grpokit_trim_1gib", "grpokit_thp_trim_1gib", "grpokit_thp_mmap_32mb"]
MALLOPT = {"M_TRIM_THRESHOLD": -1, "M_MMAP_THRESHOLD": -3, "M_MMAP_MAX": -4}  # parameter numbers from malloc.h
TRL_CONFIGS = [name for name, c in CONFIGS.items() if c["impl"] == "trl"]

PHASES = ("generate", "reward", "ref_logprobs", "policy_logprobs", "backward", "optimizer_other")


# ---- shared inputs ----------------------------------------------------------------------------
def build_inputs(workdir: Path, model: str = "bench", layers: int | None = None) -> None:
    """The model folder (model + tokenizer) and prompts.jsonl of ``model`` (a key of MODELS, ``layers`` overriding its
    layer count), built once in ``workdir`` and shared by all workers."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    from grpokit.testing import build_word_tokenizer

    if (workdir / "prompts.jsonl").exists():
        return
    fields = dict(MODELS[model], **({"num_hidden_layers": layers} if layers else {}))
    vocab = fields["vocab_size"]
    tokenizer = build_word_tokenizer([f"w{i}" for i in range(vocab - 4)])  # 4 special tokens + words = vocab
    config = Qwen2Config(
        **fields,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    import torch

    torch.manual_seed(0)
    workdir.mkdir(parents=True, exist_ok=True)
    AutoModelForCausalLM.from_config(config).save_pretrained(workdir / "model")
    tokenizer.save_pretrained(workdir / "model")
    rng = random.Random(0)
    with open(workdir / "prompts.jsonl", "w") as f:
        for _ in range(NUM_PROMPTS):
            words = " ".join(f"w{rng.randrange(vocab - 4)}" for _ in range(PROMPT_TOKENS))
            f.write(json.dumps({"prompt": words}) + "\n")


def cheap_reward(prompts, completions, **kwargs) -> list[float]:
    """Fraction of completion words whose number is even: cheap, and it varies within a group."""
    out = []
    for text in completions:
        words = text.split()
        out.append(sum(w[-1:] in "02468" for w in words) / max(len(words), 1))
    return out


def load_tokenizer(workdir: Path):
    """The word-level tokenizer; loaded by class, since AutoTokenizer would map a qwen2 folder to Qwen2's BPE class."""
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast.from_pretrained(workdir / "model")


def model_sizes(workdir: Path) -> dict:
    """Parameter counts: total, the tied LM head (vocab x hidden) and the rest (the body)."""
    cfg = json.loads((workdir / "model" / "config.json").read_text())
    head = cfg["vocab_size"] * cfg["hidden_size"]
    h, kv = cfg["hidden_size"], cfg["hidden_size"] // cfg["num_attention_heads"] * cfg["num_key_value_heads"]
    per_layer = (
        h * h * 2 + h * kv * 2 + 2 * kv + h + 3 * h * cfg["intermediate_size"] + 2 * h
    )  # attn + biases + MLP + norms
    body = cfg["num_hidden_layers"] * per_layer + h
    return {"total": head + body, "head": head, "body": body, "layers": cfg["num_hidden_layers"], "kv_width": kv}


def matmul_peak(threads: int, seconds: float = 3.0) -> dict[str, float]:
    """Best GFLOP/s of large square matmuls in float32 and bfloat16 on ``threads`` threads; bfloat16 only where the
    CPU has native bf16 matmul (elsewhere torch's fallback takes minutes per matmul and nothing runs in bf16): NaN."""
    import torch

    from grpokit.machine.cpu_caps import cpu_caps

    torch.set_num_threads(threads)
    peak = {"bfloat16": float("nan")}
    dtypes = [("float32", torch.float32)] + ([("bfloat16", torch.bfloat16)] if cpu_caps().native_bf16 else [])
    for name, dtype in dtypes:
        best = 0.0
        for n in (1024, 2048, 3072):
            a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
            a @ b
            stop = time.perf_counter() + seconds / 3
            while time.perf_counter() < stop:
                t = time.perf_counter()
                a @ b
                best = max(best, 2 * n**3 / (time.perf_counter() - t) / 1e9)
        peak[name] = best
    return peak


def memory_bandwidth(threads: int, seconds: float = 2.0, megabytes: int = 256) -> dict[str, float]:
    """Best GB/s of a large float32 copy (b = a: 2 x size moved) and triad (a = b + 2 c: 3 x size) on ``threads``
    threads, over arrays of ``megabytes`` each (far above any cache)."""
    import torch

    torch.set_num_threads(threads)
    n = megabytes * 2**20 // 4
    a, b, c = torch.empty(n), torch.rand(n), torch.rand(n)
    best = {"copy_GBps": 0.0, "triad_GBps": 0.0}
    for name, moved, op in (
        ("copy_GBps", 2, lambda: a.copy_(b)),
        ("triad_GBps", 3, lambda: torch.add(b, c, alpha=2.0, out=a)),
    ):
        op()
        stop = time.perf_counter() + seconds / 2
        while time.perf_counter() < stop:
            t = time.perf_counter()
            op()
            best[name] = max(best[name], moved * 4 * n / (time.perf_counter() - t) / 1e9)
    return best


def rss_mb() -> float:
    """This process's resident memory now, MB (from /proc/self/statm; 0 where it does not exist)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError):
        return 0.0


def max_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class HeapPeaks:
    """glibc's heap, sampled every ``every`` s by a thread: per phase (``phase``, set by :func:`sample_phases`), the
    most bytes in use and the largest heap (MB, from ``mallinfo2``: all arenas, malloc's own mmaps included). The heap
    size less the bytes in use is memory the allocator holds free: retained, or fragmented into holes too small for
    the next large request. ``peaks`` stays empty where glibc (2.33+) is not there."""

    def __init__(self, every: float = 0.02):
        import threading

        self.phase, self.peaks = (0, "start"), {}
        try:
            mallinfo2 = ctypes.CDLL("libc.so.6").mallinfo2
        except (OSError, AttributeError):
            return
        names = "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost"  # struct mallinfo2
        fields = [(n, ctypes.c_size_t) for n in names.split()]
        mallinfo2.restype = type("mallinfo2", (ctypes.Structure,), {"_fields_": fields})

        def sample():
            while True:
                m = mallinfo2()
                peak = self.peaks.setdefault(self.phase, [0.0, 0.0])
                peak[0] = max(peak[0], (m.uordblks + m.hblkhd) / 2**20)  # in use: heap chunks + mmapped chunks
                peak[1] = max(peak[1], (m.arena + m.hblkhd) / 2**20)  # heap size + mmapped chunks
                time.sleep(every)

        threading.Thread(target=sample, daemon=True).start()


# ---- workers (one process per configuration) ---------------------------------------------------
class PhaseClock:
    """Accumulates wall time per phase within the current step."""

    def __init__(self):
        self.current: dict[str, float] = {}

    def add(self, phase: str, seconds: float) -> None:
        self.current[phase] = self.current.get(phase, 0.0) + seconds

    def wrap(self, phase, fn):
        def timed(*args, **kwargs):
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.add(phase, time.perf_counter() - t)

        return timed


def run_trl(
    workdir: Path, settings: dict, prompts: int, completion_length: int, micro_batch: int, steps: int, out_dir: Path
) -> list[dict]:
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    rows = [json.loads(line) for line in (workdir / "prompts.jsonl").read_text().splitlines()]
    checkpointing = {
        "activation_checkpointing"
        if "activation_checkpointing" in GRPOConfig.__dataclass_fields__
        else "gradient_checkpointing": settings["checkpointing"]
    }
    args = GRPOConfig(
        output_dir=str(out_dir),
        use_cpu=True,
        bf16=settings["bf16"],
        **checkpointing,
        per_device_train_batch_size=micro_batch,
        gradient_accumulation_steps=prompts * G // micro_batch,
        num_generations=G,
        max_completion_length=completion_length,
        beta=0.04,
        num_iterations=1,
        learning_rate=1e-6,
        max_steps=steps,
        report_to="none",
        save_strategy="no",
        logging_steps=1,
        disable_tqdm=True,
        seed=0,
    )
    trainer = GRPOTrainer(
        model=str(workdir / "model"),
        reward_funcs=cheap_reward,
        args=args,
        train_dataset=Dataset.from_list(rows),
        processing_class=load_tokenizer(workdir),
    )
    clock, records = PhaseClock(), []
    trainer._generate = clock.wrap("generate", trainer._generate)
    trainer._calculate_rewards = clock.wrap("reward", trainer._calculate_rewards)
    logps = trainer._get_per_token_logps_and_entropies

    def timed_logps(*a, **k):
        return clock.wrap("policy_logprobs" if torch.is_grad_enabled() else "ref_logprobs", logps)(*a, **k)

    trainer._get_per_token_logps_and_entropies = timed_logps
    trainer.accelerator.backward = clock.wrap("backward", trainer.accelerator.backward)
    lengths: list[float] = []

    class StepClock(TrainerCallback):
        def on_step_begin(self, *a, **k):
            clock.current = {}
            self.t0 = time.perf_counter()

        def on_step_end(self, *a, **k):
            records.append({"step_time": time.perf_counter() - self.t0, "phases": dict(clock.current)})

        def on_log(self, args, state, control, logs=None, **k):
            if logs and "completions/mean_length" in logs:
                lengths.append(float(logs["completions/mean_length"]))

    trainer.add_callback(StepClock())
    trainer.train()
    for record, mean_length in zip(records, lengths):
        record["completion_tokens"] = mean_length * prompts * G
    return records


def plain_kernels(flags: list[str]) -> None:
    """Make every ``Kernels.select`` of this worker give the plain version of the kernels ``flags``."""
    if not flags:
        return
    import dataclasses

    from grpokit.kernels import Kernels

    select = Kernels.select.__func__
    Kernels.select = classmethod(
        lambda cls, *a, **k: dataclasses.replace(select(cls, *a, **k), **dict.fromkeys(flags, False))
    )


def run_grpokit(
    workdir: Path, settings: dict, prompts: int, completion_length: int, micro_batch: int, steps: int, out_dir: Path
) -> list[dict]:
    from grpokit import GRPOConfig, GRPOTrainer
    from grpokit.kernels import keep_freed_memory

    keep_freed_memory()  # this worker owns its process, as `grpokit train` does
    for name, value in settings.get("mallopt", {}).items():  # on top of keep_freed_memory's
        if not ctypes.CDLL("libc.so.6").mallopt(MALLOPT[name], value):
            raise SystemExit(f"glibc refused mallopt({name}, {value})")
    plain_kernels(settings.get("plain_kernels", []))
    rows = [json.loads(line) for line in (workdir / "prompts.jsonl").read_text().splitlines()]
    args = GRPOConfig(
        dtype=settings["dtype"],
        gradient_checkpointing=settings.get("checkpointing", False),
        per_device_train_batch_size=micro_batch,
        gradient_accumulation_steps=prompts * G // micro_batch,
        num_generations=G,
        max_completion_length=completion_length,
        beta=0.04,
        num_iterations=1,
        learning_rate=1e-6,
        max_steps=steps,
        output_dir=str(out_dir),
        report_to=["jsonl"],
        progress_bar=False,
        save_steps=0,
        seed=0,
        **settings.get("options", {}),
    )
    trainer = GRPOTrainer(
        model=str(workdir / "model"),
        reward_funcs=cheap_reward,
        args=args,
        train_dataset=rows,
        tokenizer=load_tokenizer(workdir),
    )
    records = []
    step_fn = trainer.loop._train_step

    def timed_step(step):
        t, faults = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        m = step_fn(step)
        records.append(
            {
                "step_time": time.perf_counter() - t,
                # pages the step touched for the first time (fresh memory from the OS): each costs a fault
                "minor_faults": resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults,
                "peak_rss_mb_so_far": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                "completion_tokens": m["completion_length/mean"] * prompts * G,
                "phases": {
                    "generate": m["time/generate"],
                    "reward": m["time/reward"],
                    "ref_logprobs": m["time/logprobs"],
                    "policy_logprobs": m.get("time/policy_logprobs", 0.0),
                    "backward": m.get("time/backward", m["time/update"]),
                },
            }
        )
        return m

    trainer.loop._train_step = timed_step
    marks: list = []  # (step, phase, "start"/"end", RSS MB now, peak RSS MB so far), the last step's kept
    heap = HeapPeaks()
    sample_phases(trainer, marks, records, heap)
    trainer.train()
    for r in records:
        r["autocast"] = str(trainer.autocast_dtype).replace("torch.", "")
        r["sampling_autocast"] = str(trainer.run.engine.autocast_dtype).replace("torch.", "")
        r["precision_notes"] = list(
            trainer.run.run_dir_spec.notes
        )  # how grpokit chose (grpokit/kernels/cpu_precision.py)
    records[-1]["rss_marks"] = [m for m in marks if m[0] == len(records)]
    for n, r in enumerate(records, 1):
        r["heap_peaks"] = {phase: peak for (step, phase), peak in heap.peaks.items() if step == n}
    records[-1]["ledger"] = memory_parts(args, workdir)
    return records


def sample_phases(trainer, marks: list, records: list, heap: HeapPeaks | None = None) -> None:
    """Record RSS now and the peak so far at the start and end of each phase of a step (generation, reference pass,
    each micro-batch's policy forward and backward, optimizer step): where the peak is reached, and what was
    resident just before; and tell ``heap`` the (step, phase) running."""
    import torch

    import grpokit.train.learning.learner as learner_module

    def sampled(phase, fn):
        def run(*a, **k):
            marks.append((len(records) + 1, phase, "start", rss_mb(), max_rss_mb()))
            if heap is not None:
                heap.phase = (len(records) + 1, phase)
            try:
                return fn(*a, **k)
            finally:
                marks.append((len(records) + 1, phase, "end", rss_mb(), max_rss_mb()))

        return run

    trainer.engine.generate = sampled("generate", trainer.engine.generate)
    trainer.learner.reference_logprobs = sampled("ref_logprobs", trainer.learner.reference_logprobs)
    trainer.learner._optimizer_step = sampled("optimizer", trainer.learner._optimizer_step)
    learner_module.completion_logprobs = sampled("policy_logprobs", learner_module.completion_logprobs)
    backward = torch.Tensor.backward
    torch.Tensor.backward = lambda self, *a, **k: sampled("backward", backward)(self, *a, **k)


def memory_parts(cfg, workdir: Path) -> dict:
    """grpokit.compose.memory's estimate of this run's parts, bytes (the floor's and those above it), for its prompts of
    PROMPT_TOKENS (the config leaves max_prompt_length at TRL's 512, which the estimate would take as the length)."""
    from grpokit.compose.memory import estimate_memory
    from grpokit.memory.fit import PROCESS_OVERHEAD
    from grpokit.memory.shape import build_meta_model

    m = estimate_memory(cfg.replace(max_prompt_length=PROMPT_TOKENS), build_meta_model(str(workdir / "model")))
    return {
        "weights": m.weights,
        "gradients": m.gradients,
        "adamw": m.adamw,
        "reference": m.reference,
        "optimizer_step": m.optimizer_step,
        **m.parts,
        "runtime": PROCESS_OVERHEAD,
        "parameters": m.parameters,
    }


def worker(argv: list[str]) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--workdir", type=Path)
    p.add_argument("--config")
    p.add_argument("--shape")
    p.add_argument("--steps", type=int)
    p.add_argument("--threads", type=int)
    p.add_argument("--peak", action="store_true")
    a = p.parse_args(argv)
    if a.peak:
        print("RESULT " + json.dumps(matmul_peak(a.threads) | memory_bandwidth(a.threads)), flush=True)
        return
    import torch

    torch.set_num_threads(a.threads)
    prompts, completion_length, _, micro_batch = SHAPES[a.shape]
    settings = CONFIGS[a.config.partition("@")[0]]
    run = run_trl if settings["impl"] == "trl" else run_grpokit
    with tempfile.TemporaryDirectory(dir=a.workdir) as out:
        records = run(a.workdir, settings, prompts, completion_length, micro_batch, a.steps, Path(out) / "run")
    for r in records:
        r["phases"]["optimizer_other"] = r["step_time"] - sum(r["phases"].values())
    peak_rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(
        "RESULT "
        + json.dumps(
            {
                "records": records,
                "peak_rss_mb": peak_rss_mb,
                "autocast": records[0].get("autocast"),
                "sampling_autocast": records[0].get("sampling_autocast"),
                "precision_notes": records[0].get("precision_notes"),
            }
        ),
        flush=True,
    )


# ---- driver --------------------------------------------------------------------------------------
def worker_env(args, config: str | None = None) -> dict:
    """A worker's environment: this one with the thread settings; for a grpokit configuration, PyTorch's huge pages
    as the ``grpokit`` command asks for them, then the configuration's own variables."""
    env = dict(
        os.environ, OMP_NUM_THREADS=str(args.threads), MKL_NUM_THREADS=str(args.threads), TOKENIZERS_PARALLELISM="false"
    )
    if args.omp_wait_policy != "default":
        env["OMP_WAIT_POLICY"] = args.omp_wait_policy
    if config is None:
        return env
    name, _, commit = config.partition("@")
    if CONFIGS[name]["impl"] == "grpokit":
        env.setdefault("THP_MEM_ALLOC_ENABLE", "1")
    if commit:
        env["PYTHONPATH"] = os.pathsep.join([str(package_at(args.workdir, commit)), env.get("PYTHONPATH", "")])
    return env | CONFIGS[name].get("env", {})


def package_at(workdir: Path, commit: str) -> Path:
    """A folder holding the grpokit package as it was at ``commit`` of this repository (``git archive``), made once."""
    tree = workdir / f"grpokit-at-{commit}"
    if not (tree / "grpokit").is_dir():
        repo = Path(__file__).resolve().parents[1]
        archive = subprocess.run(
            ["git", "-C", str(repo), "archive", commit, "grpokit"], capture_output=True, check=True
        )
        tree.mkdir(parents=True, exist_ok=True)
        subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True)
    return tree


def run_worker(
    args, worker_args: list[str], label: str, workdir: Path | None = None, config: str | None = None
) -> dict:
    cmd = [
        sys.executable,
        __file__,
        "--worker",
        "--workdir",
        str(workdir or args.workdir),
        "--threads",
        str(args.threads),
        *worker_args,
    ]
    proc = subprocess.run(cmd, env=worker_env(args, config), capture_output=True, text=True, check=False)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-6000:])
        raise SystemExit(f"{label} failed with exit code {proc.returncode}")
    return json.loads(lines[-1][len("RESULT ") :])


def summarise(runs: list[dict]) -> dict:
    """Medians over every timed step of every round (each run's first step is its warm-up); peak memory of the worst
    run, with its last step's RSS samples and memory parts (grpokit's runs)."""
    timed = [r for run in runs for r in run["records"][1:]]
    worst = max(runs, key=lambda run: run["peak_rss_mb"])["records"][-1]
    return {
        "rss_marks": worst.get("rss_marks"),
        "heap_peaks": worst.get("heap_peaks"),
        "ledger": worst.get("ledger"),
        "step_time": statistics.median(r["step_time"] for r in timed),
        "phases": {p: statistics.median(r["phases"].get(p, 0.0) for r in timed) for p in PHASES},
        "completion_tokens": statistics.median(r["completion_tokens"] for r in timed),
        "minor_faults": statistics.median(r.get("minor_faults", 0) for r in timed),
        "peak_rss_mb": max(run["peak_rss_mb"] for run in runs),
        "autocast": runs[0]["autocast"],
        "sampling_autocast": runs[0].get("sampling_autocast"),
        "precision_notes": runs[0].get("precision_notes"),
        "steps": len(timed),
    }


def forward_flops(sizes: dict, prompts: int, completion_tokens: float) -> float:
    """Required FLOPs of one forward pass over a step's sequences (see the module docstring)."""
    body_tokens = prompts * PROMPT_TOKENS + completion_tokens
    return 2 * (sizes["body"] * body_tokens + sizes["head"] * completion_tokens)


def report(shape: str, results: dict, sizes: dict, peak: dict, args) -> dict:
    prompts, T, model, micro_batch = SHAPES[shape]
    n = prompts * G
    steps = min(r["steps"] for r in results.values())
    run_steps, rounds = plan(shape, args)
    print(
        f"\n== {shape}: model {model} ({sizes['total'] / 1e6:.1f}M parameters), {prompts} prompts x G={G} = {n} "
        f"completions in micro-batches of {micro_batch}, max_completion_length {T}, {args.threads} threads, median "
        f"of {steps} steps ({rounds} rounds x {run_steps - 1} after a warm-up step) =="
    )
    head = (
        f"{'config':<14}{'step s':>8}"
        + "".join(f"{p[:10]:>11}" for p in PHASES)
        + f"{'compl/s':>9}{'tokens':>8}{'peak MB':>9}"
    )
    print(head)
    for name, r in results.items():
        print(
            f"{name:<14}{r['step_time']:>8.2f}"
            + "".join(f"{r['phases'][p]:>11.2f}" for p in PHASES)
            + f"{n / r['step_time']:>9.2f}{r['completion_tokens']:>8.0f}{r['peak_rss_mb']:>9.0f}"
        )
    out = precision_report(results)
    trl = {k: v for k, v in results.items() if k in TRL_CONFIGS}
    if "grpokit" in results and trl:
        fastest = min(trl, key=lambda k: trl[k]["step_time"])
        ratios = {}
        if "trl_default" in trl:
            ratios["step_time_ratio_vs_trl_default"] = results["grpokit"]["step_time"] / trl["trl_default"]["step_time"]
            ratios["peak_rss_ratio_vs_trl"] = results["grpokit"]["peak_rss_mb"] / trl["trl_default"]["peak_rss_mb"]
        ratios["step_time_ratio_vs_trl_tuned"] = results["grpokit"]["step_time"] / trl[fastest]["step_time"]
        if "grpokit_fp32" in results and "trl_fp32" in trl:
            ratios["step_time_ratio_fp32"] = results["grpokit_fp32"]["step_time"] / trl["trl_fp32"]["step_time"]
        print(f"ratios grpokit / TRL (TRL's fastest configuration here: {fastest}):")
        for k, v in ratios.items():
            print(f"  {k:<34}{v:.3f}")
        out.update(ratios)
    if "grpokit" in results and "grpokit_ppo" in results:  # the critic's cost: its values pass and its training
        out["ppo_step_time_ratio_vs_grpo"] = results["grpokit_ppo"]["step_time"] / results["grpokit"]["step_time"]
        out["ppo_peak_rss_ratio_vs_grpo"] = results["grpokit_ppo"]["peak_rss_mb"] / results["grpokit"]["peak_rss_mb"]
        print(
            f"grpokit_ppo / grpokit: step time {out['ppo_step_time_ratio_vs_grpo']:.3f}, peak memory "
            f"{out['ppo_peak_rss_ratio_vs_grpo']:.3f}"
        )
    for name, dtype in (("grpokit_fp32", "float32"), ("grpokit", None)):
        if name not in results:
            continue
        r = results[name]
        dtype = dtype or ("bfloat16" if r.get("autocast") == "bfloat16" else "float32")
        fwd = forward_flops(sizes, prompts, r["completion_tokens"])
        ph = r["phases"]
        train_time = ph["policy_logprobs"] + ph["backward"] + ph["optimizer_other"]
        mfu = {
            "generate": fwd / ph["generate"] / 1e9 / peak[dtype],
            "ref_logprobs": fwd / max(ph["ref_logprobs"], 1e-9) / 1e9 / peak[dtype],
            "train": 3 * fwd / train_time / 1e9 / peak[dtype],
        }
        print(
            f"MFU {name} ({dtype}, peak {peak[dtype]:.0f} GFLOP/s): "
            + ", ".join(f"{k} {v:.2f} ({v * peak[dtype]:.0f} GFLOP/s)" for k, v in mfu.items())
        )
        out[f"train_mfu_{'fp32' if dtype == 'float32' else 'bf16'}"] = mfu["train"]
        out.update(floor_report(name, r, sizes, peak, dtype, prompts, T))
    for name, r in results.items():  # grpokit's other configurations: their memory ledgers
        if name not in ("grpokit", "grpokit_fp32") and r.get("ledger"):
            out.update(memory_ledger(name, r["peak_rss_mb"], r["ledger"], r["rss_marks"], r.get("heap_peaks")))
    return out


def precision_report(results: dict) -> dict:
    """grpokit's compute choice (learning and sampling, with its reason), then each precision's step time for TRL and
    grpokit: a wrong choice shows as ``grpokit_auto_over_best_precision`` > 1."""
    out = {}
    if "grpokit" in results:
        r = results["grpokit"]
        print(f"grpokit's choice: learning {r['autocast']}, sampling {r.get('sampling_autocast')}")
        for line in r.get("precision_notes") or []:
            print(f"  {line}")
    for impl, names in (("TRL", ("trl_fp32", "trl_bf16")), ("grpokit", ("grpokit_fp32", "grpokit_bf16"))):
        times = {n: results[n]["step_time"] for n in names if n in results}
        if times:
            print(f"{impl} by precision (no checkpointing): " + ", ".join(f"{n} {t:.2f} s" for n, t in times.items()))
    fixed = {n: results[n]["step_time"] for n in ("grpokit_fp32", "grpokit_bf16") if n in results}
    if "grpokit" in results and fixed:
        best = min(fixed, key=fixed.get)
        out["grpokit_auto_over_best_precision"] = results["grpokit"]["step_time"] / fixed[best]
        print(f"grpokit auto / its best fixed precision ({best}): {out['grpokit_auto_over_best_precision']:.3f}")
    return out


def fastest_peak(peak: dict) -> tuple[str, float]:
    """(dtype, GFLOP/s) of the faster measured matmul peak: bfloat16 where it was measured and beats float32, else
    float32 (a NaN peak, not measured, never wins)."""
    rates = {k: v for k, v in peak.items() if k in ("float32", "bfloat16") and v == v}
    best = max(rates, key=rates.get)
    return best, rates[best]


def floor_report(name: str, r: dict, sizes: dict, peak: dict, dtype: str, prompts: int, T: int) -> dict:
    """Each phase's achieved GFLOP/s against the measured matmul peak, generation's weight + KV-cache traffic against
    the measured memory bandwidth, the step against its FLOP floor, and the peak memory's ledger; ``key=value``
    results (``floor_step_fraction``, ``peak_rss_over_floor``)."""
    n = prompts * G
    fwd = forward_flops(sizes, prompts, r["completion_tokens"])
    ph = r["phases"]
    faster, gflops = fastest_peak(peak)  # the floor is the machine's faster matmul, whichever dtype the run chose
    flops = {"generate": fwd, "ref_logprobs": fwd, "policy_logprobs": fwd, "backward": 2 * fwd}
    floor_s = sum(flops.values()) / gflops / 1e9  # a step's FLOPs at the peak: ~5 forward passes
    print(
        f"floor {name} ({dtype} compute): a step is {sum(flops.values()) / 1e12:.2f} TFLOP (5 forward passes of "
        f"{fwd / 1e12:.3f}), {floor_s:.1f} s at the {faster} peak ({gflops:.0f} GFLOP/s, this machine's faster "
        f"matmul); the step took {r['step_time']:.1f} s = {floor_s / r['step_time']:.0%} of the floor's speed"
    )
    for phase, f in flops.items():
        achieved = f / max(ph[phase], 1e-9) / 1e9
        print(f"  {phase:<16}{ph[phase]:>8.2f} s  {achieved:>6.0f} GFLOP/s = {achieved / gflops:>4.0%} of peak")
    # generation: each decoding step reads every weight (compute dtype) and the KV cache so far (float32)
    wbytes = sizes["total"] * (2 if dtype == "bfloat16" else 4)
    kv_row = sizes["layers"] * 2 * sizes["kv_width"] * 4  # bytes per cached position per row
    kv = sum(n * (PROMPT_TOKENS + t) * kv_row for t in range(T))
    traffic = T * wbytes + kv
    gbps = traffic / max(ph["generate"], 1e-9) / 1e9
    band = peak.get("triad_GBps", 0.0)
    print(
        f"  generate traffic: {T} decoding steps x {wbytes / 1e9:.2f} GB of weights + {kv / 1e9:.2f} GB of KV cache "
        f"= {traffic / 1e9:.1f} GB, {gbps:.1f} GB/s"
        + (f" = {gbps / band:.0%} of the measured triad bandwidth ({band:.1f} GB/s)" if band else "")
    )
    params = sizes["total"]
    adamw_traffic = 7 * 4 * params  # fused AdamW reads p, g, m, v and writes p, m, v (float32)
    print(
        f"  optimizer+rest {ph['optimizer_other']:>6.2f} s  AdamW's {adamw_traffic / 1e9:.1f} GB of traffic: "
        f"{adamw_traffic / max(ph['optimizer_other'], 1e-9) / 1e9:.1f} GB/s"
    )
    faults = r.get("minor_faults", 0)
    print(
        f"  page faults     {faults:>9,.0f} per step ({faults * resource.getpagesize() / 2**30:.2f} GiB of fresh pages)"
    )
    out = {f"floor_step_fraction_{name}": floor_s / r["step_time"]}
    ledger, marks = r.get("ledger"), r.get("rss_marks")
    if ledger:
        out.update(memory_ledger(name, r["peak_rss_mb"], ledger, marks, r.get("heap_peaks")))
    return out


def memory_ledger(name: str, peak_mb: float, ledger: dict, marks: list | None, heap: dict | None = None) -> dict:
    """Print the peak RSS as the floor's parts (weights, gradients, AdamW moments, reference: grpokit.compose.memory's
    estimate) and the parts above it at the phase where the peak was reached, with what the estimate does not
    account for (allocator retention, copies) as the rest; then, measured (:class:`HeapPeaks`, last step), each
    phase's most heap memory in use against the heap's size: how much of the rest the allocator holds free."""
    mb = lambda b: b / 2**20
    floor = {k: ledger[k] for k in ("weights", "gradients", "adamw", "reference")}
    floor_mb = mb(sum(floor.values()))
    phase, before = "?", None
    if marks:
        top = max(m[4] for m in marks)
        first = next(i for i, m in enumerate(marks) if m[4] >= top)
        phase = marks[first][1]
        before = next((m[3] for m in reversed(marks[:first]) if m[1] == phase and m[2] == "start"), None)
    print(
        f"memory {name}: peak RSS {peak_mb:,.0f} MB = {peak_mb / floor_mb:.2f}x the floor ({floor_mb:,.0f} MB), "
        f"reached during {phase}" + (f" (RSS at its start {before:,.0f} MB)" if before is not None else "")
    )
    for k, v in floor.items():
        print(f"  floor  {k:<16}{mb(v):>9,.0f} MB")
    # above the floor, by the phase that holds them: the learner's micro-batch (with the gradients) or generation
    if phase in ("generate",):
        above = {k: ledger[k] for k in ("kv_cache", "decoder_weights")}
    elif phase == "optimizer":
        above = {"optimizer_step": ledger["optimizer_step"]}
    else:
        above = {k: ledger[k] for k in ("activations", "kept_logits", "head_chunks", "weight_casts")}
    above["runtime"] = ledger["runtime"]  # grpokit.compose.memory.PROCESS_OVERHEAD: an estimate, not measured here
    for k, v in above.items():
        print(f"  above  {k:<16}{mb(v):>9,.0f} MB")
    rest = peak_mb - floor_mb - mb(sum(above.values()))
    print(f"  above  rest (allocator retention, copies, not estimated) {rest:,.0f} MB")
    if heap:
        used, size = max(u for u, _ in heap.values()), max(h for _, h in heap.values())
        print(
            "  heap (measured, last step), MB in use at most / heap size, per phase: "
            + ", ".join(f"{p} {u:,.0f} / {h:,.0f}" for p, (u, h) in heap.items())
        )
        print(
            f"  heap: at most {used:,.0f} MB in use, {size:,.0f} MB held: {size - used:,.0f} MB free inside it "
            f"(retained or fragmented); {peak_mb - size:,.0f} MB of the peak RSS outside it (memory-mapped weight "
            "files, libraries)"
        )
    return {f"peak_rss_over_floor_{name}": peak_mb / floor_mb}


def default_configs(shape: str) -> list[str]:
    """Every configuration but grpokit's memory options (and grpokit_bf16 where the CPU lacks native bf16 matmul) on
    the small model; at a real model's size TRL out of the box, TRL without checkpointing in float32 and, where the CPU
    has native bf16 matmul, in bf16 (a flag is not a speed: the faster of the two is TRL's anchor), and grpokit."""
    from grpokit.machine.cpu_caps import cpu_caps

    bf16 = cpu_caps().native_bf16  # elsewhere torch emulates bf16: minutes per step, never anyone's choice
    if SHAPES[shape][2] == "bench":
        skip = (*MEMORY_OPTIONS, *ALLOCATOR_OPTIONS, "grpokit_ppo", *(() if bf16 else ("grpokit_bf16",)))
        return [c for c in CONFIGS if c not in skip]
    return ["trl_default", *(["trl_bf16"] if bf16 else []), "trl_fp32", "grpokit"]


def plan(shape: str, args) -> tuple[int, int]:
    """(steps per run including the warm-up, rounds) of ``shape``: the options, else 4 steps x 2 rounds (3 x 1 with
    --quick, and for a real model's size, whose TRL steps take minutes each)."""
    small = SHAPES[shape][2] == "bench" and not args.quick
    return args.steps or (4 if small else 3), args.rounds or (2 if small else 1)


def model_dir(args, shape: str) -> Path:
    """The folder of ``shape``'s model and prompts (the small model's at the top of the work folder, as
    bench/memory_estimate.py builds it)."""
    model = SHAPES[shape][2]
    if model == "bench" and not args.layers:
        return args.workdir
    return args.workdir / (model + (f"-{args.layers}-layers" if args.layers else ""))


def main() -> None:
    if "--worker" in sys.argv:
        return worker([a for a in sys.argv[1:] if a != "--worker"])
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1 round of 3 steps, main shape only")
    parser.add_argument(
        "--steps", type=int, help="steps per run including 1 warm-up (default 4; 3 with --quick and for qwen0.5b)"
    )
    parser.add_argument(
        "--rounds",
        type=int,
        help="runs of every config, interleaved, pooled (default 2; 1 with --quick and for qwen0.5b)",
    )
    parser.add_argument(
        "--omp-wait-policy",
        default="passive",
        choices=["passive", "active", "default"],
        help="OMP_WAIT_POLICY of every worker (see the module docstring)",
    )
    parser.add_argument(
        "--configs",
        help=f"comma-separated subset of {', '.join(CONFIGS)} (default: all but the memory options and grpokit_ppo; "
        "for qwen0.5b see the module docstring)",
    )
    parser.add_argument(
        "--shapes", help=f"comma-separated subset of {', '.join(SHAPES)} (default main,long; main with --quick)"
    )
    parser.add_argument("--layers", type=int, help="shrink every shape's model to this many layers (a smoke test)")
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--workdir", type=Path, help="where the models and prompts are built (default: a temp folder)")
    args = parser.parse_args()
    shapes = (args.shapes or ("main" if args.quick else "main,long")).split(",")
    unknown = [s for s in shapes if s not in SHAPES] + [
        c for c in (args.configs or "").split(",") if c and c.partition("@")[0] not in CONFIGS
    ]
    if unknown:
        parser.error(
            f"unknown shape or config {', '.join(unknown)}; shapes: {', '.join(SHAPES)}; configs: {', '.join(CONFIGS)}"
        )
    configs = {s: args.configs.split(",") if args.configs else default_configs(s) for s in shapes}
    from grpokit.machine.cpu_caps import cpu_caps, describe

    caps = cpu_caps()
    with tempfile.TemporaryDirectory() as tmp:
        args.workdir = args.workdir or Path(tmp)
        args.workdir.mkdir(parents=True, exist_ok=True)
        sizes = {}
        for shape in shapes:
            build_inputs(model_dir(args, shape), SHAPES[shape][2], args.layers)
            sizes[shape] = model_sizes(model_dir(args, shape))
        print(
            f"CPU: {caps.model or caps.machine}, {describe(caps)}; native bf16 matmul: "
            f"{'yes' if caps.native_bf16 else 'no'}; torch kernels {caps.torch_capability}\n"
            f"threads {args.threads}, grpokit {_commit()}, torch {_version('torch')}, transformers "
            f"{_version('transformers')}, trl {_version('trl')}"
            + (f"; models shrunk to {args.layers} layers" if args.layers else "")
        )
        peaks = [run_worker(args, ["--peak"], "matmul peak")]
        raw: dict = {shape: {c: [] for c in configs[shape]} for shape in shapes}
        for round_ in range(1, max(plan(s, args)[1] for s in shapes) + 1):
            for shape in shapes:
                steps, rounds = plan(shape, args)
                if round_ > rounds:
                    continue
                for config in configs[shape]:
                    print(
                        f"  round {round_}/{rounds}: {config} ({shape}), load average {os.getloadavg()[0]:.1f}",
                        flush=True,
                    )
                    raw[shape][config].append(
                        run_worker(
                            args,
                            ["--config", config, "--shape", shape, "--steps", str(steps)],
                            f"{config} ({shape})",
                            model_dir(args, shape),
                            config,
                        )
                    )
        peaks.append(run_worker(args, ["--peak"], "matmul peak"))
        runs = {shape: {c: summarise(raw[shape][c]) for c in configs[shape]} for shape in shapes}
    peak = {k: max(p[k] for p in peaks) for k in peaks[0]}  # NaN (bf16 not measured) stays NaN
    bf16 = "not measured (no native bf16)" if math.isnan(peak["bfloat16"]) else f"{peak['bfloat16']:.0f} GFLOP/s"
    print(f"matmul peak (best of before and after): float32 {peak['float32']:.0f} GFLOP/s, bfloat16 {bf16}")
    summary = {}
    for shape, results in runs.items():
        values = report(shape, results, sizes[shape], peak, args)
        summary.update(values if shape == "main" else {f"{shape}_{k}": v for k, v in values.items()})
    print()
    for key, value in summary.items():
        print(f"{key}={value:.3f}")


def _commit() -> str:
    """The grpokit git commit the benchmark runs ("+changes" for a dirty tree), or its package version."""
    try:
        return subprocess.run(
            ["git", "describe", "--always", "--dirty=+changes"],
            cwd=Path(__file__).resolve().parent,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return _version("grpokit")


def _version(name: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return "not installed"


if __name__ == "__main__":
    main()
