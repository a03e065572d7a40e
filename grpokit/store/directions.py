"""Which way a metric should move: the report and `grpokit compare` colour a change good or bad only where a
direction is good for that metric (a higher pass@1, fewer groups all wrong); elsewhere (entropy, loss, KL, length:
a fall can be healthy or a collapse; zero-variance groups: they rise when a run fails to explore and when it solves
every prompt) a change stays neutral."""

from __future__ import annotations

# (pattern, +1: higher is better / -1: lower is better); an eval metric is looked up without its "eval/" prefix.
DIRECTIONS = (
    ("pass@*", 1),
    ("greedy_accuracy", 1),
    ("reward", 1),
    ("rewards/*/mean", 1),
    ("groups/all_correct_fraction", 1),
    ("tokens_per_second", 1),
    ("groups/all_wrong_fraction", -1),
    ("truncated_fraction", -1),
    ("rewards/*/errors", -1),
    ("rewards/*/null_fraction", -1),
    ("nonfinite", -1),
    ("step_time", -1),
    ("time/*", -1),
    ("rewards/*/seconds", -1),
)


def matches(name: str, pattern: str) -> bool:
    """``pattern`` with at most one ``*`` standing for any non-empty text."""
    if "*" not in pattern:
        return name == pattern
    prefix, suffix = pattern.split("*")
    return name.startswith(prefix) and name.endswith(suffix) and len(name) > len(prefix + suffix)


def direction(name: str) -> int:
    """+1 when a rise of the metric ``name`` (as logged, or labelled "name (dataset)") is good, -1 when a fall is,
    0 when neither is."""
    base = name.split(" (", 1)[0].removeprefix("eval/")
    return next((sign for pattern, sign in DIRECTIONS if matches(base, pattern)), 0)


def change_class(name: str, change: float) -> str:
    """The CSS class of a change of ``name`` by ``change``: "good", "bad", or "" (neutral, or no change)."""
    sign = direction(name)
    if sign == 0 or change == 0 or change != change:
        return ""
    return "good" if (change > 0) == (sign > 0) else "bad"
