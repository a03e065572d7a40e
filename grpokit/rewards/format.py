"""``format``: does the completion follow a layout, given as a regex or a named preset?"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from grpokit.rewards.contract import texts_of
from grpokit.rewards.registry import BUILTINS

# Tag contents may not open or close the same tag again, so "<think>a</think><think>b</think>"
# is not a single well-formed think block.
LAYOUTS = {
    "think_answer": (r"\s*<think>(?:(?!</?think>).)*</think>\s*<answer>(?:(?!</?answer>).)*</answer>\s*"),
}
MODES = ("fullmatch", "search")


@BUILTINS.register("format")
class FormatReward:
    """1.0 when the completion matches ``pattern`` (compiled with re.DOTALL), else 0.0.

    ``mode="fullmatch"`` requires the whole completion to match, ``"search"`` any part of it.
    Without ``pattern``, the preset ``layout`` is used (default ``"think_answer"``:
    ``<think>...</think><answer>...</answer>``, whitespace allowed around and between).
    """

    name = "format"

    def __init__(self, pattern: str | None = None, layout: str | None = None, mode: str = "fullmatch"):
        if pattern is not None and layout is not None:
            raise ValueError("format reward: give either pattern or layout, not both")
        if pattern is None:
            layout = layout or "think_answer"
            if layout not in LAYOUTS:
                raise ValueError(f"format reward: unknown layout {layout!r}; known: {sorted(LAYOUTS)}")
            pattern = LAYOUTS[layout]
        if mode not in MODES:
            raise ValueError(f"format reward: mode must be one of {MODES}, got {mode!r}")
        try:
            self._regex = re.compile(pattern, re.DOTALL)
        except re.error as exc:
            raise ValueError(f"format reward: invalid pattern {pattern!r}: {exc}") from exc
        self.pattern = pattern
        self.mode = mode

    def __call__(self, prompts: Sequence[str], completions: Sequence[str], **columns: Any) -> list[float]:
        match = self._regex.fullmatch if self.mode == "fullmatch" else self._regex.search
        return [1.0 if match(completion) else 0.0 for completion in texts_of(completions)]
