"""grpokit's own sampler against vLLM's CPU build: decode throughput on the benchmark's model (``bench/vs_trl.py``'s
39M Qwen2-style model, or ``--shape qwen0.5b``), the same prompts, G, lengths and threads for both.

Each sampler generates 4 prompts (32 tokens each) x G = 8 completions of 64 new tokens (EOS held back until then:
``min_new_tokens``) through grpokit's engine interface (``HFRolloutEngine`` and ``VLLMRolloutEngine``, as a run
samples), once to warm up (vLLM loads the weights then) and ``--reps`` times timed; the fastest counts. grpokit's
sampler runs in float32, in bf16 and in the dtype ``mixed_precision: auto`` measures for sampling
(``grpokit/kernels/cpu_precision.py``); vLLM in float32 and bf16 (its CPU build takes the learner's compute
dtype). Needs vLLM's CPU build (``make test-vllm`` builds ``.venv-vllm``); on a shared machine, under the vLLM lock:

    flock /tmp/vllm.lock env OMP_NUM_THREADS=2 VLLM_CPU_KVCACHE_SPACE=1 VLLM_CPU_CI_ENV=1 \\
        .venv-vllm/bin/python bench/vllm_cpu_sampler.py

Ends with ``key=value`` lines: completion tokens per second of each sampler.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from vs_trl import MODELS, PROMPT_TOKENS, G, build_inputs, load_tokenizer

PROMPTS, NEW_TOKENS = 4, 64


def timed(engine, prompt_ids: list[list[int]], params, reps: int) -> tuple[float, float]:
    """(best seconds per generation, completion tokens in it) after one warm-up generation."""
    engine.generate(prompt_ids, G, params)
    best, tokens = float("inf"), 0.0
    for _ in range(reps):
        start = time.perf_counter()
        rollouts = engine.generate(prompt_ids, G, params)
        seconds = time.perf_counter() - start
        if seconds < best:
            best, tokens = seconds, float(rollouts.completion_mask.sum())
    return best, tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="bench", choices=list(MODELS), help="bench (39M) or qwen0.5b")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--workdir", type=Path)
    parser.add_argument("--samplers", default="grpokit_fp32,grpokit_bf16,grpokit_auto,vllm_fp32,vllm_bf16")
    args = parser.parse_args()
    import torch
    from transformers import AutoModelForCausalLM

    from grpokit.kernels.cpu_precision import run_compute
    from grpokit.machine.cpu_caps import cpu_caps, describe
    from grpokit.rollout.engine import HFRolloutEngine
    from grpokit.rollout.types import SamplingParams

    torch.set_num_threads(args.threads)
    caps = cpu_caps()
    print(f"CPU: {caps.model or caps.machine}, {describe(caps)}; {args.threads} threads, torch {torch.__version__}")
    with tempfile.TemporaryDirectory() as tmp:
        workdir = args.workdir or Path(tmp)
        build_inputs(workdir, args.shape)
        folder = str(workdir / "model")
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
        tokenizer = load_tokenizer(workdir)  # the word-level tokenizer, as bench/vs_trl.py loads it
        rows = [json.loads(line) for line in (workdir / "prompts.jsonl").read_text().splitlines()[:PROMPTS]]
        prompt_ids = [tokenizer(r["prompt"], add_special_tokens=False)["input_ids"] for r in rows]
        assert all(len(ids) == PROMPT_TOKENS for ids in prompt_ids), [len(ids) for ids in prompt_ids]
        params = SamplingParams(  # plain sampling at temperature 1, as the benchmark's runs
            NEW_TOKENS,
            temperature=1.0,
            top_p=1.0,
            top_k=0,
            min_p=0.0,
            repetition_penalty=1.0,
            min_new_tokens=NEW_TOKENS,
        )
        eos, pad = [tokenizer.eos_token_id], tokenizer.pad_token_id
        cpu = torch.device("cpu")
        auto = run_compute("auto", cpu, model, "auto", sample_rows=PROMPTS * G)
        print("\n".join(auto.notes))
        makers = {
            "grpokit_fp32": lambda: HFRolloutEngine(model, eos, pad, cpu),
            "grpokit_bf16": lambda: HFRolloutEngine(model, eos, pad, cpu, autocast_dtype=torch.bfloat16),
            "grpokit_auto": lambda: HFRolloutEngine(model, eos, pad, cpu, autocast_dtype=auto.sampling),
            "vllm_fp32": lambda: vllm_engine(model, eos, pad, folder, None),
            "vllm_bf16": lambda: vllm_engine(model, eos, pad, folder, torch.bfloat16),
        }
        results = {}
        for name in args.samplers.split(","):
            engine = makers[name]()
            seconds, tokens = timed(engine, prompt_ids, params, args.reps)
            results[name] = tokens / seconds
            print(f"{name:<14}{seconds:>8.2f} s  {tokens:>6.0f} tokens  {tokens / seconds:>8.1f} tokens/s", flush=True)
            if hasattr(engine, "close"):
                engine.close()
    for name, rate in results.items():
        print(f"{name}_tokens_per_s={rate:.1f}")


def vllm_engine(model, eos: list[int], pad: int, folder: str, dtype):
    """grpokit's vLLM engine on the model's folder, computing in ``dtype`` (None: float32, the weights')."""
    from grpokit.rollout.vllm.engine import VLLMRolloutEngine
    from grpokit.rollout.vllm.settings import VLLMSettings, vllm_spec

    # a run's defaults on a CPU (1 GiB of KV cache, eager), without sleep mode, as the engine derives its spec
    settings = VLLMSettings(vllm_max_model_length=256, vllm_enable_sleep_mode=False)
    spec = vllm_spec(settings, folder, trust_remote_code=False, default_len=None)
    return VLLMRolloutEngine(model, eos, pad, spec, learner_dtype=dtype)


if __name__ == "__main__":
    main()
