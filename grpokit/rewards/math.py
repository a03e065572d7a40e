"""``accuracy``: is the completion's final answer equal to the reference answer?

The final answer is extracted in this order of precedence: the last ``\\boxed{...}`` (nested
braces allowed), the text after the last ``####`` (GSM8K style), the last
``<answer>...</answer>``, else the last number in the text. It is compared with the reference
by math-verify (LaTeX, fractions, symbolic equivalence with sympy) when installed
(``pip install grpokit[math]``), and always by normalised exact match, so ``0.5`` matches
``\\frac{1}{2}`` only with math-verify but ``1,000`` matches ``1000`` either way.
"""

from __future__ import annotations

import functools
import logging
import re
import warnings
from collections.abc import Sequence
from typing import Any

from grpokit.rewards.contract import require_column, texts_of
from grpokit.rewards.registry import BUILTINS

_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")
_HASHES = re.compile(r"####\s*([^\n]*)")
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
# A minus sign counts only when it cannot be subtraction ("5-3" ends in the number 3), and
# thousands separators only in groups of three ("1,000" is one number, "1,2" two).
_NUMBER = re.compile(r"(?:(?<![\w)])-)?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:/\d+)?")


def _last_boxed(text: str) -> str | None:
    """Content of the last balanced ``\\boxed{...}``; braces inside are matched by depth."""
    found = None
    for match in _BOXED.finditer(text):
        depth = 1
        for end in range(match.end(), len(text)):
            depth += {"{": 1, "}": -1}.get(text[end], 0)
            if depth == 0:
                found = text[match.end() : end]
                break
    return found


def extract_answer(text: str) -> str | None:
    """The final answer in a completion, or None when there is none (see the module docstring)."""
    boxed = _last_boxed(text)
    if boxed is not None:
        return boxed.strip()
    hashes = _HASHES.findall(text)
    if hashes:
        return hashes[-1].strip()
    tagged = _ANSWER_TAG.findall(text)
    if tagged:
        return tagged[-1].strip()
    numbers = _NUMBER.findall(text)
    return numbers[-1] if numbers else None


def reference_answer(reference: Any) -> str | None:
    """The reference as a string, or None when missing or empty.

    A reference that is itself a worked solution (it contains ``\\boxed``, ``####`` or
    ``<answer>``, like GSM8K's ``answer`` column) is reduced to its final answer; any other
    reference is used whole, so ``\\frac{1}{2}`` stays a fraction rather than its last number.
    """
    if reference is None:
        return None
    text = str(reference).strip()
    if _BOXED.search(text) or "####" in text or _ANSWER_TAG.search(text):
        text = extract_answer(text) or ""
    return text or None


def normalise(answer: str) -> str:
    """Canonical text for exact match: no ``$``, spaces, thousands commas, trailing zeros/period.

    ``" $1,000.50 "`` -> ``"1000.5"``; ``"5.0"`` -> ``"5"``.
    """
    text = re.sub(r"\s+", "", answer.replace("$", ""))
    text = re.sub(r"(?<=\d),(?=\d{3}(?!\d))", "", text)
    text = text.rstrip(".")
    if re.fullmatch(r"-?\d+\.\d+", text):
        text = text.rstrip("0").rstrip(".")
    return text


def _not_timeout_warning(record: logging.LogRecord) -> bool:
    return not record.getMessage().startswith("Timeout is disabled")


@functools.cache
def _silence_timeout_warnings() -> None:
    # math-verify warns once that its own timeout is off; here that is deliberate (see below).
    for logger in ("math_verify.parser", "math_verify.grader"):
        logging.getLogger(logger).addFilter(_not_timeout_warning)


EXACT_MATCH_ONLY = (
    "reward accuracy: math-verify is not installed, so answers are compared by exact match only (0.5 does not "
    "match \\frac{1}{2}, nor x+1 1+x); pip install 'grpokit[math]' for symbolic equivalence."
)


@functools.cache
def math_verify_installed() -> bool:
    """Whether math-verify can be imported (the ``math`` extra); without it ``accuracy`` is exact match only."""
    try:
        import math_verify  # noqa: F401
    except ImportError:
        return False
    return True


def _math_verify_equal(prediction: str, reference: str) -> bool:
    """Symbolic equality by math-verify; False when it is not installed or cannot parse either."""
    try:
        from math_verify import parse, verify
    except ImportError:
        return False
    _silence_timeout_warnings()
    # The signal-based timeouts of math-verify only work on the main thread; reward functions
    # run on worker threads, and the RewardRunner enforces the timeout itself.
    gold = parse(f"${reference.replace('$', '')}$", parsing_timeout=None)
    predicted = parse(f"${prediction.replace('$', '')}$", parsing_timeout=None)
    if not gold or not predicted:
        return False
    return bool(verify(gold, predicted, timeout_seconds=None))


def answers_match(prediction: str, reference: str) -> bool:
    """Normalised exact match, else math-verify equivalence."""
    return normalise(prediction) == normalise(reference) or _math_verify_equal(prediction, reference)


@BUILTINS.register("accuracy")
class AccuracyReward:
    """1.0 when the completion's final answer equals the reference, else 0.0.

    None when the reference is missing or empty. The reference comes from the dataset column
    ``answer_column``; a missing column raises :class:`~grpokit.rewards.contract.RewardError`.
    """

    name = "accuracy"

    def __init__(self, answer_column: str = "answer"):
        self.answer_column = answer_column
        self.required_columns = (answer_column,)  # checked against the dataset before the model loads
        if not math_verify_installed():  # said at the start of the run, not discovered from its curves
            warnings.warn(f"grpokit: {EXACT_MATCH_ONLY}", stacklevel=2)

    def __call__(self, prompts: Sequence[str], completions: Sequence[str], **columns: Any) -> list[float | None]:
        references = require_column(columns, self.answer_column, self.name)
        return [self.score(c, r) for c, r in zip(texts_of(completions), references, strict=True)]

    @staticmethod
    def score(completion: str, reference: Any) -> float | None:
        """The reward of one completion against one reference."""
        gold = reference_answer(reference)
        if gold is None:
            return None
        prediction = extract_answer(completion)
        if prediction is None:
            return 0.0
        return 1.0 if answers_match(prediction, gold) else 0.0
