"""The task of examples/tools: questions a tiny model cannot answer by heart, a calculator tool, the reward.

Two kinds of question, both ``What is {a}{op}{b}?``:

- ``hard``: ``a*b`` with two-digit ``a`` and ``b`` (8,100 questions). A 0.14M-parameter model does not
  learn two-digit multiplication by heart; with the calculator it only has to copy the question into the
  call and the result into its answer.
- ``easy``: ``a+b`` with one-digit ``a`` and ``b`` (100 questions), answered directly. They are all in
  the training split (there are too few to hold some out); the held-out split has hard questions only.

The split is deterministic: every hard question is listed in a fixed order, shuffled with a seed, and the
first ``n_eval`` are held out (never trained on, neither by the warm start nor by GRPO).

The reward follows the grpokit / TRL contract ``fn(prompts, completions, **columns)``. With tools, a
completion is the list of messages after the prompt (assistant turns, tool results); the answer is the
content of the last assistant message.
"""

from __future__ import annotations

import ast
import operator
import random
import re
from collections.abc import Callable, Sequence
from typing import Any

QUESTION = "What is {a}{op}{b}?"
HARD, EASY = "hard", "easy"
_INTEGER = re.compile(r"-?\d+")
_QUESTION = re.compile(r"What is (\d+)([*+])(\d+)\?")

_BINARY: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
}
_MAX_DIGITS = 30  # a result longer than this is refused (no 10**10**10 from a long chain of products)


def _evaluate(node: ast.AST) -> int | float:
    if isinstance(node, ast.Expression):
        return _evaluate(node.body)
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _evaluate(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp):
        if type(node.op) not in _BINARY:
            raise ValueError(f"unsupported operator {type(node.op).__name__}; use + - * / // %")
        value = _BINARY[type(node.op)](_evaluate(node.left), _evaluate(node.right))
        if abs(value) >= 10**_MAX_DIGITS:
            raise ValueError(f"the result has more than {_MAX_DIGITS} digits")
        return value
    raise ValueError(f"unsupported expression element {type(node).__name__}; use numbers, + - * / // % and ()")


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression.

    Args:
        expression: Numbers joined by + - * / // % and parentheses, such as "47*86".
    """
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as exc:
        raise ValueError(f"not an arithmetic expression: {expression!r}") from exc
    value = _evaluate(tree)  # only numbers and arithmetic operators: no names, calls or attributes
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(value)


def question(a: int, op: str, b: int) -> dict[str, Any]:
    """A dataset row: ``prompt`` (one user message), ``answer`` and ``kind``."""
    value = a * b if op == "*" else a + b
    return {
        "prompt": [{"role": "user", "content": QUESTION.format(a=a, op=op, b=b)}],
        "answer": str(value),
        "kind": HARD if op == "*" else EASY,
    }


def splits(n_eval: int = 200, seed: int = 0) -> tuple[list[dict], list[dict], list[dict]]:
    """(hard train, hard held-out, easy) rows: the held-out rows are the first ``n_eval`` hard questions
    after a seeded shuffle; the easy ones are all one-digit sums."""
    hard = [question(a, "*", b) for a in range(10, 100) for b in range(10, 100)]
    if not 0 < n_eval < len(hard):
        raise ValueError(f"n_eval must be between 1 and {len(hard) - 1}, got {n_eval}")
    random.Random(seed).shuffle(hard)
    easy = [question(a, "+", b) for a in range(10) for b in range(10)]
    return hard[n_eval:], hard[:n_eval], easy


def estimate(a: int, op: str, b: int) -> str:
    """A guess by heart: both numbers rounded to tens, then the operation (47*86 -> 50*90 -> 4500)."""
    a, b = (a + 5) // 10 * 10, (b + 5) // 10 * 10
    return str(a * b if op == "*" else a + b)


def operands(row: dict) -> tuple[int, str, int]:
    """(a, op, b) of a row's question."""
    a, op, b = _QUESTION.fullmatch(row["prompt"][-1]["content"]).groups()
    return int(a), op, int(b)


def final_answer(completion: str | Sequence[dict]) -> str:
    """The text of the model's answer: the content of the last assistant message (a completion given as
    messages), or for plain text what follows the last tool response."""
    if isinstance(completion, str):
        return completion.rsplit("</tool_response>", 1)[-1]
    replies = [m for m in completion if m.get("role") == "assistant"]
    return str(replies[-1].get("content") or "") if replies else ""


def called_tool(completion: str | Sequence[dict]) -> bool:
    """Whether the completion calls a tool (a well-formed call; a botched one is not a tool use)."""
    if isinstance(completion, str):
        return "<tool_call>" in completion
    return any(m.get("role") == "assistant" and m.get("tool_calls") for m in completion)


def is_correct(completion: str | Sequence[dict], answer: str) -> bool:
    """The answer is one integer (surrounding whitespace allowed) equal to ``answer``."""
    text = final_answer(completion).strip()
    return bool(_INTEGER.fullmatch(text)) and int(text) == int(answer)


def answer_correct(prompts, completions, answer, log_metric=None, **columns) -> list[float]:
    """1.0 when the final answer is the right number and nothing else, else 0.0. Logs ``tool_use``: the
    fraction of completions that called a tool (``rewards``' metrics, and ``eval/tool_use``)."""
    if log_metric is not None:
        log_metric("tool_use", sum(map(called_tool, completions)) / len(completions))
    return [1.0 if is_correct(c, a) else 0.0 for c, a in zip(completions, answer, strict=True)]
