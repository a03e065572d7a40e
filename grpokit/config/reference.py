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


def typed_keys_source() -> str:
    """The source of ``config/typed_keys.py``: every key of GRPOConfig's sections, annotated with its type, so that
    editors and type checkers see ``cfg.learning_rate: float`` (GRPOConfig reads them from its sections at run time);
    the TRL-only keys in its base class, :func:`trl_typed_keys_source`."""
    lines = [
        '"""Every key of ``GRPOConfig``\'s sections with its type, for editors and type checkers: generated from the',
        "config's sections by ``python scripts/gen_config_reference.py`` (a test checks it is current); do not edit by",
        "hand. Annotations only: at run time GRPOConfig reads each key from its section (``cfg.algo.beta``); the",
        'TRL-only keys are in typed_trl_keys.py."""',
        "",
        "from __future__ import annotations",
        "",
        "from typing import TYPE_CHECKING, Any",
        "",
        "from grpokit.config.typed_trl_keys import TypedTrlKeys",
        "",
        "if TYPE_CHECKING:",
        *_imports(SECTIONS.values()),
        "",
        "",
        "class TypedKeys(TypedTrlKeys):",
        '    """The sections, then each section\'s keys (the TRL-only keys: the base class)."""',
        "",
    ]
    for section, cls in SECTIONS.items():
        lines.append(f"    {section}: {cls.__name__}")
    for section, cls in SECTIONS.items():
        lines.append(f"    # {section}")
        lines += [f"    {f.name}: {f.type}" for f in section_fields(cls)]
    return "\n".join(lines) + "\n"


def trl_typed_keys_source() -> str:
    """The source of ``config/typed_trl_keys.py``: TRL's GRPOConfig keys that no section holds, typed from TRL's
    defaults (accepted as TRL takes them)."""
    lines = [
        '"""The TRL-only keys of ``GRPOConfig`` with their types, for editors and type checkers: generated from TRL\'s',
        "defaults by ``python scripts/gen_config_reference.py`` (a test checks it is current); do not edit by hand.",
        'The sections\' keys are in typed_keys.py."""',
        "",
        "from __future__ import annotations",
        "",
        "from typing import Any",
        "",
        "",
        "class TypedTrlKeys:",
        '    """The TRL-only keys, accepted as TRL\'s GRPOConfig takes them."""',
        "",
    ]
    seen = {f.name for cls in SECTIONS.values() for f in section_fields(cls)}
    for name, default in trl_defaults.TRL_DEFAULTS.items():
        if name not in seen and name.isidentifier():
            kind = type(default).__name__ if isinstance(default, (bool, int, float, str)) else "Any"
            lines.append(f"    {name}: {kind if default is not None else 'Any'}")
    return "\n".join(lines) + "\n"


def _imports(classes) -> list[str]:
    """``from module import A, B`` lines (indented, sorted as the formatter sorts them) for ``classes``."""
    by_module: dict[str, set[str]] = {}
    for cls in classes:
        by_module.setdefault(cls.__module__, set()).add(cls.__name__)
    return [f"    from {module} import {', '.join(sorted(names))}" for module, names in sorted(by_module.items())]
