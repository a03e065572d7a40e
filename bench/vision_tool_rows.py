"""What decoding a multi-turn row by full forward costs against the KV cache, on a tiny Qwen2-VL: the rows a tool
showed an image decode by one forward over their whole conversation each step (rollout/vision_rows.py: M-RoPE
positions jump after an image, so they cannot continue on a cache with text positions). Here the tool returns text and
the same rollouts are sampled twice, the rows on the KV cache (the default) and every row forced onto the full-forward
batch; the tokens must be equal (the same model numbers, each row's own random stream) and the seconds are printed.

    OMP_NUM_THREADS=1 python bench/vision_tool_rows.py [--length 48] [--groups 2] [--reps 3]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from grpokit.models.vision import make_processor
from grpokit.rollout import vision_rows
from grpokit.rollout.engine import HFRolloutEngine
from grpokit.rollout.multiturn import MultiTurnEngine
from grpokit.rollout.types import SamplingParams
from grpokit.testing.tiny_vlm import build_tiny_qwen2_vl
from grpokit.tools import ConversationTokens, ToolCall, ToolExecutor


def look(k: int) -> str:
    """Look at screen k.

    Args:
        k: Which screen.
    """
    return f"screen {k} is red"


def parser(text: str) -> list[ToolCall]:
    return [] if len(text) % 3 == 0 else [ToolCall("look", {"k": len(text)}, text, 0, len(text))]


def sample(model, processor, args, forced: bool):
    chat = ConversationTokens(processor.tokenizer, processor=processor)
    tok = processor.tokenizer
    engine = HFRolloutEngine(model, [tok.eos_token_id, chat.end_of_turn], tok.pad_token_id, torch.device("cpu"), seed=0)
    prompts = [[{"role": "user", "content": f"colour {k} ?"}] for k in range(args.groups)]
    real = vision_rows.shows_images
    vision_rows.shows_images = (lambda rollout: True) if forced else real
    try:
        with ToolExecutor([look], isolation="thread") as executor:
            multi = MultiTurnEngine(engine, chat, executor, max_tool_calling_iterations=3, parser=parser)
            start = time.perf_counter()
            rollouts = multi.generate(prompts, 4, SamplingParams.plain(args.length))
            return time.perf_counter() - start, rollouts
    finally:
        vision_rows.shows_images = real


def main() -> None:
    parser_ = argparse.ArgumentParser()
    parser_.add_argument("--length", type=int, default=48)
    parser_.add_argument("--groups", type=int, default=2)
    parser_.add_argument("--reps", type=int, default=3)
    args = parser_.parse_args()
    words = ["colour", "?", "screen", "is", "red", *(str(k) for k in range(10))]
    model, tokenizer, images = build_tiny_qwen2_vl(words=words, hidden_size=64, num_layers=4)
    model = model.float().eval()
    processor = make_processor("qwen2_vl", images, tokenizer)
    times = {False: [], True: []}
    for _ in range(args.reps):
        seconds, kept = sample(model, processor, args, forced=False)
        times[False].append(seconds)
        seconds, full_rows = sample(model, processor, args, forced=True)
        times[True].append(seconds)
        assert torch.equal(full_rows.completion_ids, kept.completion_ids), "full forward sampled other tokens"
    cached, full = statistics.median(times[False]), statistics.median(times[True])
    rounds = sum(c.tool_rounds for c in kept.conversations)
    tokens = int(kept.completion_mask.sum())
    print(f"{args.groups * 4} rollouts, {tokens} tokens, {rounds} tool rounds; same tokens on both paths")
    print(f"KV cache: {cached:.3f} s   full forward every step: {full:.3f} s   ({full / cached:.2f}x)")


if __name__ == "__main__":
    main()
