"""The fill-in task: a run of words from a well-known ordered list with one span replaced by ``_``.

A text is a window of 4 to 7 consecutive items of one list (days, months, numbers, ...), in
ascending or descending order. One span of 1 to 3 items inside the window (never its first or last
item) is masked, leaving at least three words visible so that the direction is never in doubt; the
prompt is the window with a single ``_`` in place of the span, then ``=``, and the answer is the
span. The mask does not say how many items it hides, so the model has to read the words on both
sides of it:

    prompt  "tuesday _ saturday sunday = "      answer "wednesday thursday friday"

Every possible text is enumerated and split (seeded) into train and held-out eval texts.
``corrupt`` makes the near misses used twice: as the negatives the judge learns to reject (written
into the gap with ``fill``), and as the sloppy labels of the policy's warm start (so that GRPO has
something to sharpen).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

LISTS: dict[str, tuple[list[str], bool]] = {
    # name: (items, cyclic)
    "days": (["monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday"], True),
    "months": (
        [
            "january",
            "february",
            "march",
            "april",
            "may",
            "june",
            "july",
            "august",
            "september",
            "october",
            "november",
            "december",
        ],
        True,
    ),
    "numbers": (
        [
            "one",
            "two",
            "three",
            "four",
            "five",
            "six",
            "seven",
            "eight",
            "nine",
            "ten",
            "eleven",
            "twelve",
            "thirteen",
            "fourteen",
            "fifteen",
            "sixteen",
            "seventeen",
            "eighteen",
            "nineteen",
            "twenty",
        ],
        False,
    ),
    "tens": (["ten", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety", "hundred"], False),
    "rainbow": (["red", "orange", "yellow", "green", "blue", "indigo", "violet"], False),
    "planets": (["mercury", "venus", "earth", "mars", "jupiter", "saturn", "uranus", "neptune"], False),
    "notes": (["do", "re", "mi", "fa", "sol", "la", "ti"], True),
}
MASK = "_"
SEP = "="
WINDOWS = range(4, 8)
SPANS = range(1, 4)


@dataclass(frozen=True)
class Text:
    """One window of a list: ``words`` with ``words[start:start + length]`` masked."""

    words: tuple[str, ...]
    start: int
    length: int
    list_name: str
    direction: int
    """1 when the window follows the list's order, -1 when it runs backwards."""

    @property
    def prompt(self) -> str:
        left, right = self.words[: self.start], self.words[self.start + self.length :]
        return " ".join([*left, MASK, *right, SEP]) + " "  # trailing space: prompt + completion stays word-split

    @property
    def answer(self) -> str:
        return " ".join(self.words[self.start : self.start + self.length])


def vocabulary() -> list[str]:
    """Every word a prompt or an answer can hold."""
    words = [MASK, SEP]
    for items, _ in LISTS.values():
        words += [w for w in items if w not in words]
    return words


def all_texts() -> list[Text]:
    """Every (list, direction, window, masked span) combination."""
    texts = []
    for name, (items, cyclic) in LISTS.items():
        for direction in (1, -1):
            ordered = items[::direction]
            for first in range(len(ordered)):
                for width in WINDOWS:
                    if not cyclic and first + width > len(ordered):
                        continue
                    words = tuple(ordered[(first + i) % len(ordered)] for i in range(width))
                    # three visible words always include two neighbours, which fix the direction
                    for length in (k for k in SPANS if width - k >= 3):
                        for start in range(1, width - length):
                            texts.append(Text(words, start, length, name, direction))
    return texts


def splits(n_eval: int = 200, seed: int = 0) -> tuple[list[Text], list[Text]]:
    """(train, eval) texts: a seeded shuffle of :func:`all_texts`, the first ``n_eval`` held out."""
    texts = all_texts()
    random.Random(seed).shuffle(texts)
    return texts[n_eval:], texts[:n_eval]


def rows(texts: list[Text]) -> list[dict]:
    """Dataset rows for GRPOTrainer: ``prompt`` and the reference ``answer``."""
    return [{"prompt": t.prompt, "answer": t.answer} for t in texts]


def corrupt(text: Text, rng: random.Random) -> str:
    """A wrong answer, most often a near miss: one item dropped (the empty answer for a one-item span)
    or one too many, shifted by one or two places, reversed, one item swapped for another item of the
    list, or random items of the list."""
    items, cyclic = LISTS[text.list_name]
    words = list(text.words)
    span = words[text.start : text.start + text.length]
    ordered = items[:: text.direction]
    while True:
        kind = rng.choice(("drop", "extra", "shift", "reverse", "substitute", "random"))
        if kind == "drop":
            i = rng.randrange(len(span))
            wrong = span[:i] + span[i + 1 :]
        elif kind == "extra":  # the visible neighbour on one side, repeated inside the gap
            wrong = [words[text.start - 1], *span] if rng.random() < 0.5 else [*span, words[text.start + text.length]]
        elif kind == "shift":
            step = rng.choice((-2, -1, 1, 2))
            position = [ordered.index(w) + step for w in span]
            if not cyclic and not all(0 <= p < len(ordered) for p in position):
                continue
            wrong = [ordered[p % len(ordered)] for p in position]
        elif kind == "reverse":
            wrong = span[::-1]
        elif kind == "substitute":
            i = rng.randrange(len(span))
            wrong = [*span[:i], rng.choice(items), *span[i + 1 :]]
        else:
            wrong = rng.sample(items, rng.choice(SPANS))
        if wrong != span:
            return " ".join(wrong)


def fill(prompt: str, completion: str) -> str:
    """The text with the completion written into the gap: ``"tuesday _ friday = "`` + ``"wednesday thursday"``
    gives ``"tuesday wednesday thursday friday"``."""
    masked = prompt.rsplit(SEP, 1)[0].split()
    i = masked.index(MASK)
    return " ".join(masked[:i] + completion.split() + masked[i + 1 :])


def exact_match(completion: str, answer: str) -> bool:
    """The completion's words equal the answer's words (spacing ignored)."""
    return completion.split() == answer.split()
