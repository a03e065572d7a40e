"""The user-facing error of a bad setting, shared by the config package and the parts that check their own
settings (so that no part below the composition root imports the config package)."""


class ConfigError(ValueError):
    """A config problem, with a message that names the fix."""
