"""Configuration: section dataclasses, the GRPOConfig facade, YAML loading, CLI overrides, validation.

The modules, one concern each: ``training`` and ``running`` (the sections, a docstring line per field),
``schema`` (sections by name, aliases, allowed values), ``keys`` (key forms and TRL's keys to fields),
``coerce`` (values to field types), ``facade`` (GRPOConfig), ``validation`` and ``rules`` (per-section
checks, then cross-section rules), ``loading`` (YAML and overrides), ``reference`` (docs/config.md).
"""

from grpokit.config.facade import GRPOConfig
from grpokit.config.loading import load_config, parse_overrides
from grpokit.config.reference import config_reference
from grpokit.config.sections import (
    ALIASES,
    CHOICES,
    FIELD_SECTION,
    PATH_FIELDS,
    REPORT_SINKS,
    SECTIONS,
    ConfigError,
    field_docs,
)

__all__ = [
    "ALIASES",
    "CHOICES",
    "FIELD_SECTION",
    "PATH_FIELDS",
    "REPORT_SINKS",
    "SECTIONS",
    "ConfigError",
    "GRPOConfig",
    "config_reference",
    "field_docs",
    "load_config",
    "parse_overrides",
]
