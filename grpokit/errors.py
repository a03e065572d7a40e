"""The user-facing error of a bad setting, shared by the config package and the parts that check their own
settings (so that no part below the composition root imports the config package)."""


class ConfigError(ValueError):
    """A config problem, with a message that names the fix."""


def require(ok: bool, message: str) -> None:
    """Raise a ConfigError with ``message`` unless ``ok``: a part's settings check (``check()``) in one line."""
    if not ok:
        raise ConfigError(message)
