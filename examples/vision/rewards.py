"""The example's reward: 1 when the completion is the square's colour and nothing else."""


def colour_correct(completions, answer, **kwargs):
    """1.0 when the completion (surrounding spaces ignored) is the ``answer`` column's colour name, else 0.0."""
    return [1.0 if completion.strip() == expected else 0.0 for completion, expected in zip(completions, answer)]
