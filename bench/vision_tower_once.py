"""Learner time per step on a tiny Qwen2-VL at G = 8: the vision tower once per prompt (the prompt, images and all,
run once per group; its G completions read its KV cache) against the model's own forward over repeated inputs (each
of the B x G rows with its prompt's pixel values, as TRL, verl and OpenRLHF run it).

    OMP_NUM_THREADS=1 python bench/vision_tower_once.py [--image-side 224] [--steps 5]

Each step is the learner's forward and backward over B prompts x G completions of T tokens (float32, one thread);
the median of ``--steps`` steps after one warm-up is printed for both paths, with the log-prob difference between
them (the same numbers: tests/unit/test_vision_inputs.py checks 1e-5 against the model's own forward).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from PIL import Image

from grpokit.data.prompts import PromptSource
from grpokit.models.vision import make_processor, register_processor
from grpokit.rollout.engine import HFRolloutEngine
from grpokit.rollout.types import SamplingParams
from grpokit.testing.tiny_vlm import build_tiny_qwen2_vl
from grpokit.train.learning import policy_logprobs
from grpokit.train.learning.policy_logprobs import build_batch, completion_logprobs


def step_seconds(model, batch, steps: int) -> tuple[float, torch.Tensor]:
    times, logprobs = [], None
    for i in range(steps + 1):
        model.zero_grad(set_to_none=True)
        start = time.perf_counter()
        logprobs, _ = completion_logprobs(model, batch, 1.0)
        (logprobs * batch.completion_mask).sum().backward()
        if i:  # the first is a warm-up
            times.append(time.perf_counter() - start)
    return statistics.median(times), logprobs.detach()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--image-side", type=int, default=224)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--generations", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    torch.manual_seed(0)
    model, tokenizer, images = build_tiny_qwen2_vl(words=["colour", "?"], hidden_size=64, image_side=args.image_side)
    processor = make_processor("qwen2_vl", images, tokenizer)
    register_processor(tokenizer, processor)
    rows = [
        {"prompt": "colour ?", "image": Image.new("RGB", (args.image_side, args.image_side), (40 * i, 90, 200))}
        for i in range(args.prompts)
    ]
    source = PromptSource(rows, tokenizer, max_prompt_length=None)
    engine = HFRolloutEngine(model, [tokenizer.eos_token_id], tokenizer.pad_token_id, torch.device("cpu"))
    params = SamplingParams.plain(args.tokens, suppress_tokens=(tokenizer.eos_token_id,))  # every completion T long
    rollouts = engine.generate(list(source.ids), args.generations, params)
    batch = build_batch(model, rollouts, tokenizer.pad_token_id, torch.device("cpu"))
    model.train()
    once, expected = step_seconds(model, batch, args.steps)
    shares = policy_logprobs.shares_prefix
    policy_logprobs.shares_prefix = lambda m: False  # the repeated-input forward (DDP, FSDP, checkpointing's path)
    try:
        repeated, got = step_seconds(model, batch, args.steps)
    finally:
        policy_logprobs.shares_prefix = shares
    tokens = len(source.ids[0])
    print(
        f"B={args.prompts} G={args.generations} T={args.tokens} image {args.image_side}px "
        f"({rollouts.prompt_ids[0].pixels['pixel_values'].size(0)} patches, prompt {tokens} tokens)"
    )
    print(f"vision tower once per prompt: {once * 1000:.0f} ms/step")
    print(f"repeated inputs (G x):        {repeated * 1000:.0f} ms/step  ({repeated / once:.2f}x)")
    diff = (got - expected).abs()
    print(f"max |log-prob difference|:    {float(diff.max()):.2e} (mean |log-prob| {float(expected.abs().mean()):.3f})")


if __name__ == "__main__":
    main()
