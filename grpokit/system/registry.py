"""One registry style for every extension point (losses, advantage estimators, algorithms, engines, samplers,
sources, rewards, off-policy corrections): a :class:`Registry` of entries by name.

An entry is a frozen dataclass (or a class) that says what the part needs; one with settings names its settings
class (``EngineEntry.settings``, ``PolicyLossType.params``). Adding one is one line: ``REGISTRY["name"] = Entry(...)``,
or the registry's decorator where it has one (``register_loss``)."""

from __future__ import annotations

import difflib
from typing import Any


class Registry(dict):
    """Entries by name for ``kind`` (the config key that names one: ``engine``, ``loss_type`` ...). A dict, so an
    extension adds itself with ``REGISTRY[name] = entry``; :meth:`entry` looks one up."""

    def __init__(self, kind: str, entries: dict[str, Any] | None = None):
        super().__init__(entries or {})
        self.kind = kind

    def entry(self, name: str, names: list[str] | None = None) -> Any:
        """The entry called ``name``; a ValueError naming the valid ones (``names``: those a user may name, default
        all) and the closest otherwise."""
        if name in self:
            return self[name]
        names = list(self) if names is None else names
        close = difflib.get_close_matches(str(name), names, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"unknown {self.kind} {name!r}; valid choices: {', '.join(names)}{hint}")
