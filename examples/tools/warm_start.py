"""The warm start of examples/tools: a tiny Llama that knows the calculator's format but seldom uses it.

GRPO only sharpens what the policy already samples, so a random model first learns the format with
teacher forcing, on conversations rendered and tokenized exactly as a rollout is
(:class:`grpokit.tools.ConversationTokens`; loss only on the assistant's tokens, the loss mask of
training). Each step draws its questions afresh (``easy_fraction`` of them easy), and for a hard one
whether the teacher calls the calculator:

1. ``clean_steps`` with a teacher that calls it on a hard question with probability
   ``clean_tool_probability`` (the call with the question's numbers, the tool's result, then the result
   copied as the answer) and otherwise guesses by heart (:func:`calculator.estimate`: both factors
   rounded to tens, 47*86 -> 4500, right only when both are multiples of ten). The model learns to
   call, to copy, and the guessing rule.
2. ``habit_steps`` with a teacher that calls with probability ``tool_probability`` (one time in ten).

Easy questions (one-digit sums) are always answered directly, with the right sum. Since the guesses are
learned alongside the calls, the second phase only moves one decision, "call or guess", taken at the
first token of the answer and shared by all hard questions; the copying survives it. Before GRPO the
model therefore calls on about a tenth of the hard questions and answers those right, and a correctness
reward can turn the decision up quickly (the demo's warm start rests on the same idea, see
grpokit/demo/warmstart.py).
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass

import torch
from calculator import EASY, calculator, estimate, operands

from grpokit.testing import build_tiny_causal_lm
from grpokit.tools import ConversationTokens, tool_schemas


@dataclass(frozen=True)
class WarmStartConfig:
    hidden_size: int = 64
    num_layers: int = 2
    num_heads: int = 4
    clean_steps: int = 800
    """Steps on a teacher that calls the calculator on most hard questions (learn to call and to copy)."""
    clean_tool_probability: float = 0.8
    """Probability that the teacher calls the calculator on a hard question in those steps."""
    habit_steps: int = 200
    """Steps on a teacher that calls it with probability ``tool_probability`` after that (learn its habit)."""
    batch_size: int = 32
    learning_rate: float = 3e-3
    """Peak AdamW rate (linear warmup over 5 % of the steps, then cosine decay to 0)."""
    tool_probability: float = 0.1
    """Probability that the teacher calls the calculator on a hard question."""
    easy_fraction: float = 0.2
    """Fraction of the drawn questions that are easy."""
    seed: int = 0


def _lr_factor(step: int, total: int) -> float:
    warmup = max(1, total // 20)
    return min(1.0, (step + 1) / warmup) * 0.5 * (1.0 + math.cos(math.pi * step / total))


class Conversations:
    """Token ids and loss mask of the teacher's conversations, rendered once each and kept."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.chat = ConversationTokens(tokenizer)
        self.schemas = tool_schemas([calculator])
        self._cache: dict[tuple[str, bool], tuple[list[int], list[int]]] = {}

    def _turn(self, text: str) -> list[int]:
        return [*self.tokenizer.encode(text, add_special_tokens=False), self.chat.end_of_turn]

    def get(self, row: dict, use_tool: bool) -> tuple[list[int], list[int]]:
        """(ids, mask) of ``row`` answered directly or through the calculator (mask 1 on the model's tokens)."""
        key = (row["prompt"][-1]["content"], use_tool)
        if key not in self._cache:
            conversation = self.chat.start(row["prompt"], self.schemas)
            if use_tool:
                a, op, b = operands(row)
                expression = f"{a}{op}{b}"
                call = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "%s"}}\n</tool_call>'
                conversation.add_generated(self._turn(call % expression))
                result = calculator(expression)
                self.chat.add_tool_results(conversation, [{"role": "tool", "name": "calculator", "content": result}])
                conversation.add_generated(self._turn(result))
            else:  # easy questions: the answer; hard ones: a guess by heart
                guess = row["answer"] if row["kind"] == EASY else estimate(*operands(row))
                conversation.add_generated(self._turn(guess))
            self._cache[key] = (conversation.ids, conversation.mask)
        return self._cache[key]


def warm_start(hard: list[dict], easy: list[dict], tokenizer, config: WarmStartConfig, log=print):
    """A LlamaForCausalLM trained on the teacher's conversations about ``hard`` and ``easy`` (training rows
    only); returned in eval mode. Batches are right-padded: under causal attention a pad after a sequence
    cannot change it, so no attention mask is needed."""
    model, _ = build_tiny_causal_lm(
        None,
        tokenizer,
        arch="llama",
        hidden_size=config.hidden_size,
        num_layers=config.num_layers,
        num_heads=config.num_heads,
        max_positions=256,
        seed=config.seed,
    )
    conversations = Conversations(tokenizer)
    pad = tokenizer.pad_token_id
    rng = random.Random(config.seed)
    total = config.clean_steps + config.habit_steps
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.learning_rate, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: _lr_factor(s, total))
    model.train()
    start = time.perf_counter()
    for step in range(total):
        tool_probability = config.clean_tool_probability if step < config.clean_steps else config.tool_probability
        rows, targets = [], []
        for _ in range(config.batch_size):
            row = rng.choice(easy) if rng.random() < config.easy_fraction else rng.choice(hard)
            use_tool = row["kind"] != EASY and rng.random() < tool_probability
            ids, mask = conversations.get(row, use_tool)
            rows.append(ids)
            targets.append([i if m else -100 for i, m in zip(ids, mask)])
        width = max(len(r) for r in rows)
        input_ids = torch.tensor([r + [pad] * (width - len(r)) for r in rows])  # [batch, width]
        labels = torch.tensor([t + [-100] * (width - len(t)) for t in targets])  # [batch, width]
        loss = model(input_ids=input_ids, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        if log and (step % 100 == 0 or step == total - 1):
            phase = "mostly calls" if step < config.clean_steps else "habit"
            log(f"warm start {step + 1}/{total} ({phase})  loss {loss.item():.3f}  {time.perf_counter() - start:.0f}s")
    return model.eval()
