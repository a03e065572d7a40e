"""Multi-turn tool rollouts: each sequence's KV cache kept across turns (``keep_cache=True``, the default)
against prefilling the whole conversation again at every turn (``keep_cache=False``), in the same
process, runs interleaved; prints the times, the tokens each prefilled and the ratio.

The task: a random-init Qwen2-style model (byte-level tokenizer with Qwen2.5's tool template, so a
prompt with one tool schema is ~600 tokens) and an ``echo`` tool returning ~100 characters. A random
model writes no real tool calls, so a parser stands in: a turn calls the tool unless its length is a
multiple of 4; about one token in 29 ends a turn. Both modes sample from the same per-rollout
random streams, so they produce the same rollouts (checked here) and the difference is only the prefill.

    python bench/multiturn.py [--repeats 3] [--hidden 256] [--layers 4] [--prompts 4] [--generations 8]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from grpokit.kernels import keep_freed_memory
from grpokit.rollout.engine import HFRolloutEngine
from grpokit.rollout.multiturn import MultiTurnEngine
from grpokit.rollout.types import SamplingParams
from grpokit.testing import build_tiny_causal_lm
from grpokit.testing.tools import qwen_style_tokenizer
from grpokit.tools import ConversationTokens, ToolCall, ToolExecutor


def echo(text: str) -> str:
    """Look a text up.

    Args:
        text: The text to look up.
    """
    return f"Results for {text!r}: " + "lorem ipsum dolor sit amet " * 3


def parser(text: str) -> list[ToolCall]:
    return [] if len(text) % 4 == 0 else [ToolCall("echo", {"text": text[-5:]}, text, 0, len(text))]


def prefilled_tokens(rollouts, keep: bool) -> int:
    """Tokens run through prefill: each prompt once (its rollouts share it), then at each later turn the
    whole conversation so far, or only what the kept cache lacks (the last sampled token and the tool suffix)."""
    total = sum(len(p) for p in rollouts.prompt_ids)
    for n, conversation in enumerate(rollouts.conversations):
        prompt = len(rollouts.prompt_ids[n // rollouts.num_generations])
        starts = [turn.tokens[0] for turn in conversation.turns if turn.role == "assistant"]
        ends = [turn.tokens[1] for turn in conversation.turns if turn.role == "assistant"]
        for start, end in zip(starts[1:], ends):
            total += start - end + 1 if keep else prompt + start
    return total


def main() -> None:
    parser_ = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser_.add_argument("--repeats", type=int, default=3)
    parser_.add_argument("--hidden", type=int, default=256)
    parser_.add_argument("--layers", type=int, default=4)
    parser_.add_argument("--prompts", type=int, default=4)
    parser_.add_argument("--generations", type=int, default=8)
    parser_.add_argument("--max-completion-length", type=int, default=512)
    parser_.add_argument("--threads", type=int, default=1)
    args = parser_.parse_args()
    torch.set_num_threads(args.threads)
    keep_freed_memory()  # as `grpokit train` does: the cache's big buffers reuse freed memory

    tokenizer = qwen_style_tokenizer()
    model, _ = build_tiny_causal_lm(
        None,
        tokenizer,
        arch="qwen2",
        hidden_size=args.hidden,
        num_layers=args.layers,
        num_heads=4,
        num_kv_heads=2,
        max_positions=4096,
    )
    model.eval()
    chat = ConversationTokens(tokenizer)
    stops = [i for i in range(len(tokenizer)) if i % 29 == 0]
    prompts = [[{"role": "user", "content": f"Question {i}: look something up."}] for i in range(args.prompts)]
    params = SamplingParams.plain(args.max_completion_length)
    print(
        f"qwen2 hidden {args.hidden}, {args.layers} layers; {args.prompts} prompts x {args.generations} rollouts, "
        f"max_completion_length {args.max_completion_length}, up to 4 tool rounds; {args.threads} torch thread(s)"
    )
    times: dict[bool, list[float]] = {True: [], False: []}
    with ToolExecutor([echo], isolation="thread", max_workers=8) as executor:
        for repeat in range(args.repeats + 1):  # the first round warms up
            results = {}
            for keep in (True, False):
                engine = HFRolloutEngine(model, stops, tokenizer.pad_token_id, torch.device("cpu"), seed=repeat)
                multi = MultiTurnEngine(
                    engine, chat, executor, max_tool_calling_iterations=4, parser=parser, keep_cache=keep
                )
                start = time.perf_counter()
                results[keep] = multi.generate(prompts, args.generations, params)
                if repeat:
                    times[keep].append(time.perf_counter() - start)
            kept, again = results[True], results[False]
            assert torch.equal(kept.completion_ids, again.completion_ids), "both modes should sample the same rollouts"
    rollouts = results[True]
    rounds = [c.tool_rounds for c in rollouts.conversations]
    print(
        f"last batch: {sum(rounds) / len(rounds):.2f} tool rounds per rollout, "
        f"{int(rollouts.loss_mask.sum())} sampled tokens, {int(rollouts.completion_mask.sum())} completion tokens"
    )
    for keep, name in ((True, "kept KV cache"), (False, "re-prefill each turn")):
        print(
            f"{name:22s} {statistics.median(times[keep]):7.2f} s (median of {args.repeats}), "
            f"{prefilled_tokens(results[keep], keep):7d} tokens prefilled"
        )
    ratios = ", ".join(f"{again / kept:.2f}" for kept, again in zip(times[True], times[False]))
    ratio = statistics.median(times[False]) / statistics.median(times[True])
    print(f"re-prefill / kept: {ratio:.2f}x (per repeat: {ratios})")


if __name__ == "__main__":
    main()
