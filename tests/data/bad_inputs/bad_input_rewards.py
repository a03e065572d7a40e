"""A reward that needs the dataset column ``answer`` (named in its signature), for the bad-input corpus."""


def exact(prompts, completions, answer, **columns):
    return [float(c.strip() == a) for c, a in zip(completions, answer)]
