"""Keys into fields: sections, dotted keys, bare keys, aliases and TRL's GRPOConfig keys mapped to field names."""

from __future__ import annotations

import difflib
from typing import Any

import grpokit.config.trl_forms as trl_forms
import grpokit.config.trl_keys as trl_keys
from grpokit.config.sections import ALIASES, FIELD_SECTION, SECTIONS, ConfigError


def from_trl(given: dict, context: dict, trl_keywords: frozenset = frozenset()) -> tuple[dict, dict, dict]:
    try:
        return trl_keys.from_trl(given, context, set(FIELD_SECTION), trl_keywords)
    except trl_forms.TRLValueError as exc:
        raise ConfigError(str(exc)) from None


def unknown_key_message(key: str) -> str:
    candidates = (
        list(FIELD_SECTION)
        + list(ALIASES)
        + [f"{s}.{k}" for k, s in FIELD_SECTION.items()]
        + list(SECTIONS)
        + ["rewards"]
        + list(trl_keys.TRL_DEFAULTS)
    )
    close = difflib.get_close_matches(key, candidates, n=1, cutoff=0.6)
    hint = f" Did you mean {close[0]!r}?" if close else " Run `grpokit explain CONFIG` to see every key."
    return f"unknown config key {key!r}.{hint}"


def field_in_section(section: str, key: str) -> str:
    """The field named by ``section.key``; a field put under the wrong section is named with its own."""
    name = ALIASES.get(key, key)
    home = FIELD_SECTION.get(name)
    if home == section:
        return name
    if home is not None:
        raise ConfigError(
            f"{key!r} is not a key of section {section!r}: it belongs to {home!r}; move it under `{home}:` (or write "
            "it at the top level)."
        )
    raise ConfigError(unknown_key_message(f"{section}.{key}"))


def flatten(values: dict) -> dict:
    """Map sections, dotted keys, bare keys and aliases to {field_name: value}."""
    flat: dict[str, Any] = {}
    for key, value in values.items():
        key = str(key).lstrip("-").replace("-", "_")
        if key in SECTIONS and key in trl_keys.TRL_DEFAULTS and not isinstance(value, dict):
            flat[key] = value  # TRL's `optim` (the optimizer's name), not grpokit's section
            continue
        if key in SECTIONS:
            if value is None:
                continue
            if not isinstance(value, dict):
                raise ConfigError(f"section {key!r} must be a mapping of keys to values, got {type(value).__name__}.")
            for sub, v in value.items():
                flat[field_in_section(key, str(sub))] = v
            continue
        if "." in key:
            section, _, sub = key.partition(".")
            if section not in SECTIONS:
                raise ConfigError(unknown_key_message(key))
            flat[field_in_section(section, sub)] = value
            continue
        name = ALIASES.get(key, key)
        if name not in FIELD_SECTION and name not in trl_keys.TRL_DEFAULTS:
            raise ConfigError(unknown_key_message(key))
        flat[name] = value
    return flat
