"""A reward that needs the dataset column ``answer`` (named in its signature), for the bad-input corpus."""


def exact(prompts, completions, answer, **columns):
    return [float(c.strip() == a) for c, a in zip(completions, answer)]


def one_value(prompts, completions, **columns):
    """Breaks the contract: one value for the whole batch."""
    return [0.0]


def singular(completion, answer):
    """Names ``completion`` where the trainer passes ``completions``."""
    return [float(c.strip() == a) for c, a in zip(completion, answer)]


def prompt_param(prompt, completions, **columns):
    """Names the prompt column, which the trainer passes as ``prompts``."""
    return [0.0 for _ in completions]
