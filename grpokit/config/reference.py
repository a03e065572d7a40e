"""The generated config reference (docs/config.md): every field, its default and its docstring line."""

from __future__ import annotations

import dataclasses

import grpokit.config.trl_defaults as trl_defaults
from grpokit.config.sections import ALIASES, SECTIONS, field_docs, section_fields


def config_reference() -> str:
    """Markdown reference of every field, generated from the dataclasses and their docstrings."""
    lines = []
    for section, cls in SECTIONS.items():
        lines += [f"### `{section}`", "", "| key | default | meaning |", "|---|---|---|"]
        docs = field_docs(cls)
        for f in section_fields(cls):
            default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
            lines.append(f"| `{f.name}` | `{default!r}` | {docs.get(f.name, '').replace('|', chr(92) + '|')} |")
        lines.append("")
    lines += [
        "### `rewards`",
        "",
        "A list; each entry is a built-in name, `module:function`, `path/to/file.py:function`, a reward model (a "
        "folder or a Hub id `owner/name` holding an `AutoModelForSequenceClassification`, scored as TRL scores it), "
        "or a mapping `{name: ..., weight: ..., <params>}`. A bare name is a built-in, never a Hub id; an existing "
        "folder is a model; `:` names a function ([from_trl.md](from_trl.md#reward-functions)).",
        "",
        "Aliases: " + ", ".join(f"`{k}` = `{v}`" for k, v in ALIASES.items()) + ".",
        "",
        f"Every key of TRL {trl_defaults.TRL_VERSION}'s `GRPOConfig` is accepted as well (`bf16`, `save_strategy`, "
        '`report_to="none"` ...): [from_trl.md](from_trl.md) lists how each maps onto the keys above.',
    ]
    return "\n".join(lines)
