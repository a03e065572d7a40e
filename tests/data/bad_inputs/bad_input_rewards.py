"""A reward that needs the dataset column ``answer`` (named in its signature), for the bad-input corpus."""


def exact(prompts, completions, answer, **columns):
    return [float(c.strip() == a) for c, a in zip(completions, answer)]


def one_value(prompts, completions, **columns):
    """Breaks the contract: one value for the whole batch."""
    return [0.0]
