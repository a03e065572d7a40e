"""Loading: a YAML file and command-line overrides into a validated :class:`GRPOConfig`."""

from __future__ import annotations

import typing
from pathlib import Path
from typing import Any

import yaml

from grpokit.config.coerce import parse_scalar
from grpokit.config.facade import GRPOConfig
from grpokit.config.keys import flatten
from grpokit.config.sections import ALIASES, FIELD_SECTION, SECTIONS, ConfigError


def parse_overrides(args: list[str]) -> dict:
    """Turn ``key=value``, ``section.key=value``, ``--key=value`` / ``--key value`` and a bare ``--flag`` (= true) into
    a dict."""
    out: dict[str, Any] = {}
    i = 0
    while i < len(args):
        arg = args[i]
        if "=" in arg:
            key, _, value = arg.partition("=")
        elif arg.startswith("--") and i + 1 < len(args) and not args[i + 1].startswith("--") and "=" not in args[i + 1]:
            key, value = arg, args[i + 1]
            i += 1
        elif arg.startswith("--"):
            key, value = arg, "true"  # a bare flag such as --overwrite
        else:
            raise ConfigError(f"cannot read override {arg!r}: write key=value, section.key=value or --key=value.")
        out[key.lstrip("-")] = _cli_value(key, value)
        i += 1
    return out


def _cli_value(key: str, text: str) -> Any:
    """A command-line value: parsed with YAML rules, except for a string field, whose text is kept as
    written (``output_dir=007`` stays '007'); there only null or ~ mean None, for an optional field."""
    name = key.lstrip("-").replace("-", "_").rpartition(".")[2]
    name = ALIASES.get(name, name)
    section = FIELD_SECTION.get(name)
    if section is None:
        return parse_scalar(text)
    hint = typing.get_type_hints(SECTIONS[section])[name]
    if hint is str:
        return text
    if hint == str | None:
        return None if text in ("null", "~") else text
    if hint == str | dict | None:  # a dataset: a path or hf:... as written, a {path: ...} mapping parsed
        if text in ("null", "~"):
            return None
        return parse_scalar(text) if text.lstrip().startswith("{") else text
    return parse_scalar(text)


def load_config(path: str | Path | None = None, overrides: list[str] | dict | None = None) -> GRPOConfig:
    """Load a YAML config, apply overrides, validate. Errors name the file and the key."""
    data: dict[str, Any] = {}
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(
                f"config file {str(path)!r} does not exist; pass the path of a YAML file (see examples/)."
            )
        try:
            data = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
            raise ConfigError(f"{path}: not valid YAML{where}: {getattr(exc, 'problem', None) or exc}") from None
        if not isinstance(data, dict):
            raise ConfigError(
                f"{path}: the top level must be a mapping of sections (model:, data:, algo:, ...), got "
                f"{type(data).__name__}."
            )
    if isinstance(overrides, list):
        overrides = parse_overrides(overrides)
    rewards = data.pop("rewards", None)
    values = flatten(data)
    overrides = dict(overrides or {})
    if "rewards" in overrides:
        rewards = overrides.pop("rewards")
    values.update(flatten(overrides))
    if rewards is not None and not isinstance(rewards, list):
        rewards = [rewards]
    return GRPOConfig.from_grpokit(rewards=rewards, **values)  # grpokit's step counts (generation batches)
