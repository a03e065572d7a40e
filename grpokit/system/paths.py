"""Paths as a user writes them: ``~`` and environment variables expanded."""

from __future__ import annotations

import os


def expand_path(path: str) -> str:
    """``~`` and environment variables (``$VAR``, ``${VAR}``) expanded, as a shell would; other text unchanged."""
    return os.path.expanduser(os.path.expandvars(path))
