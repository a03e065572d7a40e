"""How the report and the compare page put a value into HTML: every value escaped, whatever its declared type (a
store or config.yaml from someone else can hold text where a number belongs), and JSON inside a script element with
``<``, ``>`` and ``&`` as ``\\u003c``, ``\\u003e`` and ``\\u0026`` (the same JSON strings, which no markup can end)."""

from __future__ import annotations

import json
from html import escape
from typing import Any


def text(value: Any) -> str:
    """``value`` as HTML text or an attribute's value: ``str(value)`` with ``& < > " '`` escaped."""
    return escape(value if isinstance(value, str) else str(value))


def number(value: Any, spec: str = ".4g") -> str:
    """A number formatted with ``spec``; "-" for None; anything else (a value of the wrong type) escaped as it is."""
    if value is None:
        return "-"
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return format(value, spec)
    return text(value)


def script_json(value: Any, **dumps: Any) -> str:
    """``value`` as JSON that is safe inside ``<script type="application/json">``: no ``<``, ``>`` or ``&``."""
    out = json.dumps(value, default=str, **dumps)
    return out.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")
