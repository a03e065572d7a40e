"""Built-in arithmetic task: the prompts and rewards of ``grpokit demo``.

A problem is a prompt such as ``"23+45="`` and its answer ``"68"``; the model is expected to reply
with the number alone, then end of sequence. The prompt is kept this terse on purpose: the demo
trains a tiny model on a laptop CPU, where every prompt character costs compute on every step. Every
problem over the operand range is enumerated, shuffled with a seed, and cut into a held-out eval
split and a train split, so the two never share a question and the same seed always gives the same
splits.

Rewards follow the grpokit contract ``fn(prompts, completions, **columns) -> list[float | None]``
with ``answer`` coming from the dataset column of the same name.
"""

from __future__ import annotations

import operator
import random
import re
from collections.abc import Callable

PROMPT_TEMPLATE = "{a}{op}{b}="
# Every character a prompt or an answer can contain; the demo's char tokenizer is built from it.
ALPHABET = "0123456789+-*= "

OPERATORS: dict[str, Callable[[int, int], int]] = {
    "+": operator.add,
    "-": operator.sub,
    "*": operator.mul,
}

_INTEGER = re.compile(r"-?\d+")


def make_problem(a: int, op: str, b: int) -> dict[str, str]:
    """Return ``{"prompt": "{a}{op}{b}=", "answer": str(a op b)}``."""
    if op not in OPERATORS:
        raise ValueError(f"unknown operator {op!r}; choose from {sorted(OPERATORS)}")
    return {"prompt": PROMPT_TEMPLATE.format(a=a, op=op, b=b), "answer": str(OPERATORS[op](a, b))}


def arithmetic_splits(
    seed: int = 0,
    max_operand: int = 29,
    operators: str = "+",
    n_eval: int = 100,
) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    """Deterministic, disjoint (train, eval) splits of every ``a op b`` with ``0 <= a, b <= max_operand``.

    All ``(max_operand + 1) ** 2 * len(operators)`` problems are listed in a fixed order, shuffled
    with ``random.Random(seed)``, and the first ``n_eval`` become the eval split.
    """
    if max_operand < 0:
        raise ValueError(f"max_operand must be >= 0, got {max_operand}")
    ops = list(dict.fromkeys(operators))
    problems = [make_problem(a, op, b) for op in ops for a in range(max_operand + 1) for b in range(max_operand + 1)]
    if not 0 < n_eval < len(problems):
        raise ValueError(f"n_eval must be between 1 and {len(problems) - 1}, got {n_eval}")
    random.Random(seed).shuffle(problems)
    return problems[n_eval:], problems[:n_eval]


def first_integer(text: str) -> int | None:
    """The first integer (optional leading minus, then digits) in ``text``, or None if there is none."""
    match = _INTEGER.search(text)
    return int(match.group()) if match else None


def arithmetic_correct(prompts: list[str], completions: list[str], answer: list[str], **columns) -> list[float]:
    """1.0 when the first integer in the completion equals the answer, else 0.0.

    ``"68"``, ``" 68"`` and ``"68 apples"`` are right for answer ``"68"``; ``"680"``, ``"6 8"`` and
    ``"no idea"`` are wrong. Comparing integers (not strings) makes ``"068"`` right as well.
    """
    return [
        1.0 if first_integer(completion) == int(expected) else 0.0
        for completion, expected in zip(completions, answer, strict=True)
    ]


def arithmetic_format(prompts: list[str], completions: list[str], **columns) -> list[float]:
    """1.0 when the completion is one integer and nothing else (surrounding whitespace allowed).

    Completions are decoded without special tokens, so a reply that stopped with end of sequence
    right after the number passes, while one that runs on (``"68?"``, ``"68 is it"``) does not.
    """
    return [1.0 if _INTEGER.fullmatch(completion.strip()) else 0.0 for completion in completions]
