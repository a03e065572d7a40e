"""Values into fields: a value checked against its field's annotation, CLI text parsed with YAML rules."""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from typing import Any, Union

import yaml

from grpokit.config.sections import FIELD_SECTION, PATH_FIELDS, ConfigError
from grpokit.system.paths import expand_path


def coerce(cls: type, name: str, value: Any) -> Any:
    """Check a value against the field's annotation; accept ints for floats and strings from the CLI."""
    hints = typing.get_type_hints(cls)
    expected = hints[name]
    optional = False
    origin = typing.get_origin(expected)
    if origin in (Union, types.UnionType):
        args = [t for t in typing.get_args(expected) if t is not type(None)]
        optional = len(args) < len(typing.get_args(expected))
        if len(args) > 1:  # str | dict (a dataset): a value of one of the types, as given
            return _one_of(cls, name, value, tuple(args), optional)
        expected = args[0]
    if value is None:
        if optional or expected is Any:
            return None
        raise ConfigError(f"{name} cannot be null; give a {expected.__name__}{_example(cls, name)}.")
    if expected is Any:
        return value
    if isinstance(value, str) and expected is not str:
        value = parse_scalar(value)
        if value is None and optional:
            return None
    if expected is bool:
        if isinstance(value, bool):
            return value
    elif expected is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
    elif expected is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            try:
                number = float(value)
            except OverflowError:  # an int beyond the float range
                number = math.inf
            if not math.isfinite(number):
                raise ConfigError(f"{name}={value!r} must be a finite number{_example(cls, name)}.")
            return number
    elif expected is str:
        if isinstance(value, str):
            return expand_path(value) if name in PATH_FIELDS else value
    elif expected is list:
        if isinstance(value, (list, tuple)):
            return list(value)
        if isinstance(value, (str, int)):
            return [value]
    elif expected is dict and isinstance(value, dict):
        return dict(value)
    hint = ""
    if isinstance(value, dict) and value and all(key in FIELD_SECTION for key in value):
        sections = sorted({FIELD_SECTION[key] for key in value})  # a section's settings under a setting's name
        hint = f" Settings like {', '.join(value)} go in the section {' / '.join(sections)}: write them under it."
    raise ConfigError(
        f"{name}={value!r} has the wrong type: expected {expected.__name__}, got "
        f"{type(value).__name__}{_example(cls, name)}.{hint}"
    )


def _one_of(cls: type, name: str, value: Any, types_: tuple, optional: bool) -> Any:
    if value is None and optional:
        return None
    if isinstance(value, types_):
        return expand_path(value) if isinstance(value, str) and name in PATH_FIELDS else value
    expected = " or ".join(t.__name__ for t in types_)
    raise ConfigError(f"{name}={value!r} has the wrong type: expected {expected}, got {type(value).__name__}.")


def _example(cls: type, name: str) -> str:
    """' (for example name: <default>)', showing the expected form; empty for a null default."""
    f = next(f for f in dataclasses.fields(cls) if f.name == name)
    default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
    if default is None:
        return ""
    shown = yaml.safe_dump(default, default_flow_style=True).strip().removesuffix("...").strip()
    return f" (for example {name}: {shown})"


def parse_scalar(text: str) -> Any:
    """Parse a CLI value with YAML rules (1e-5 -> float, true -> bool, [1,8] -> list, null -> None)."""
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        return text
    if isinstance(value, str):
        try:
            return float(value)  # YAML 1.1 reads "1e-5" as a string
        except ValueError:
            return value
    return value
