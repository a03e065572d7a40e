"""Reward functions loaded by path (`file.py:function`) from the CLI tests."""


def target_fraction(prompts, completions, target, **columns):
    return [c.split().count(t) / max(1, len(c.split())) for c, t in zip(completions, target)]
