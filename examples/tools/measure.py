"""Held-out measurement of examples/tools: answer accuracy and tool-use rate, sampled and greedy.

The questions are answered in multi-turn rollouts with the calculator (grpokit's
:class:`~grpokit.rollout.multiturn.MultiTurnEngine`, as in training): the model may call it, reads its
result, and answers. A rollout is correct when its final answer is the right number and nothing else
(:func:`calculator.is_correct`, the reward of training); it used the tool when it made at least one
well-formed call.
"""

from __future__ import annotations

import torch
from calculator import calculator, called_tool, is_correct

from grpokit.rollout.engine import HFRolloutEngine
from grpokit.rollout.multiturn import MultiTurnEngine
from grpokit.rollout.types import SamplingParams
from grpokit.tools import ConversationTokens, ToolExecutor


@torch.no_grad()
def measure(
    model,
    tokenizer,
    rows: list[dict],
    *,
    samples: int = 4,
    max_completion_length: int = 64,
    max_tool_calling_iterations: int = 2,
    temperature: float = 1.0,
    seed: int = 0,
    batch: int = 64,
) -> dict[str, float]:
    """``accuracy`` and ``tool_use`` over ``samples`` rollouts per row at ``temperature``, and
    ``greedy_accuracy`` / ``greedy_tool_use`` of one greedy rollout per row."""
    engine = HFRolloutEngine(
        model, [tokenizer.eos_token_id], tokenizer.pad_token_id, next(model.parameters()).device, seed=seed
    )
    with ToolExecutor([calculator], isolation="thread") as executor:
        multi = MultiTurnEngine(
            engine, ConversationTokens(tokenizer), executor, max_tool_calling_iterations=max_tool_calling_iterations
        )
        result = {}
        for prefix, n, params in (
            ("", samples, SamplingParams.plain(max_completion_length, temperature)),
            ("greedy_", 1, SamplingParams.plain(max_completion_length, greedy=True)),
        ):
            correct = used = 0
            for start in range(0, len(rows), batch):
                chunk = rows[start : start + batch]
                rollouts = multi.generate([r["prompt"] for r in chunk], n, params)
                for k, conversation in enumerate(rollouts.conversations):
                    correct += is_correct(conversation.messages, chunk[k // n]["answer"])
                    used += called_tool(conversation.messages)
            result[f"{prefix}accuracy"] = correct / (len(rows) * n)
            result[f"{prefix}tool_use"] = used / (len(rows) * n)
    return result
