"""The quickstart's reward function.

grpokit calls a reward function with keywords, as TRL does: ``completions`` (the sampled texts), ``prompts``,
and every other column of the dataset under its own name, one value per completion. It returns one float per
completion (or None where it has no opinion). Take the arguments you need and ``**kwargs`` for the rest.
"""


def correct(completions, answer, **kwargs):
    """1.0 when the completion is the expected answer (surrounding spaces ignored), else 0.0."""
    return [1.0 if completion.strip() == expected else 0.0 for completion, expected in zip(completions, answer)]
