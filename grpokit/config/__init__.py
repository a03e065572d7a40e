"""Configuration: the GRPOConfig facade over sections assembled from the parts' own settings classes, YAML loading,
CLI overrides, validation.

The modules, one concern each: ``training`` and ``running`` (the sections, each assembled from the settings classes
beside the parts: every field's default, type and doc line is there), ``sections`` (sections by name, aliases, allowed
values, and ``part_checks``, which runs each settings class's own ``check()``), ``keys`` (key forms and TRL's keys to
fields), ``trl_keys`` and ``trl_forms`` (TRL's names and value forms), ``coerce`` (values to field types), ``facade``
(GRPOConfig), ``validation`` (the order of the checks), ``rules`` and ``placement`` (the rules that span parts),
``loading`` (YAML and overrides), ``reference`` (docs/config.md and typed_keys.py).
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
