"""Tools, a tool-call parser and rewards loaded by path (`file.py:name`) in the tool-training tests."""

from grpokit.tools import ToolCall


def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: The first factor.
        b: The second factor.
    """
    return a * b


def every_other_turn(text: str) -> list[ToolCall]:
    """A random model never writes a well-formed call: here a turn calls ``multiply`` unless its length is a
    multiple of 3, so random turns make rollouts with different numbers of tool rounds."""
    if len(text) % 3 == 0:
        return []
    return [ToolCall("multiply", {"a": len(text) % 7, "b": 3}, text, 0, len(text))]


def answer_has_digit(completions, **kwargs):
    """1 when the model's last message holds a digit: the rewards see each rollout's messages."""
    return [float(any(ch.isdigit() for ch in completion[-1]["content"])) for completion in completions]


def screenshot_every_other_turn(text: str) -> list[ToolCall]:
    """As :func:`every_other_turn`, the call a ``screenshot`` (a tool that returns an image: test_vision_tools.py)."""
    if len(text) % 3 == 0:
        return []
    return [ToolCall("screenshot", {"k": len(text) % 3}, text, 0, len(text))]
