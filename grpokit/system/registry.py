"""One registry style for every extension point (losses, advantage estimators, algorithms, engines, rewards, tool
parsers ...): a :class:`Registry` of entries by name, filled by its decorator.

    @ENGINES.register("mine", settings=MySettings)
    def build(parts, settings): ...

The decorator makes the registry's entry from the decorated object and the keyword arguments (``entry``: the
registry's own factory, e.g. ``EngineEntry(build, settings=MySettings)``; without one the object itself is the entry)
and returns the object unchanged. A name registered twice by different code is refused (the same function again, its
module imported anew, is not)."""

from __future__ import annotations

import difflib
from collections.abc import Callable
from typing import Any


class Registry(dict):
    """Entries by name for ``kind`` (the config key that names one: ``engine``, ``loss_type`` ...). ``entry``:
    ``entry(name, obj, **fields)`` -> the entry of a decorated ``obj`` (None: ``obj`` itself). A dict, so the entries
    are looked up as in one; :meth:`entry` names the valid ones when a name is unknown."""

    def __init__(self, kind: str, entry: Callable[..., Any] | None = None, fields: Callable[..., None] | None = None):
        super().__init__()
        self.kind = kind
        self.make = entry
        self.check_fields = fields  # fields(**fields): raises for impossible ones when the decorator is made
        self.origins: dict[str, str] = {}  # name -> where its registered object was defined

    def register(self, name: str, *, overwrite: bool = False, **fields: Any) -> Callable[[Any], Any]:
        """Decorator: register the decorated object under ``name`` (with ``fields``, the entry's other fields).
        ``overwrite``: replace an entry of the same name registered by other code (otherwise a ValueError)."""
        if self.check_fields is not None:
            self.check_fields(**fields)

        def decorate(obj: Any) -> Any:
            where = f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', type(obj).__qualname__)}"
            if name in self and not overwrite and self.origins.get(name, where) != where:
                taken = f"{self.kind} {name!r} is registered already (by {self.origins[name]})"
                raise ValueError(f"{taken}; choose another name.")
            self[name] = obj if self.make is None else self.make(name, obj, **fields)
            self.origins[name] = where
            return obj

        return decorate

    def entry(self, name: str, names: list[str] | None = None) -> Any:
        """The entry called ``name``; a ValueError naming the valid ones (``names``: those a user may name, default
        all) and the closest otherwise."""
        if name in self:
            return self[name]
        names = list(self) if names is None else names
        close = difflib.get_close_matches(str(name), names, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"unknown {self.kind} {name!r}; valid choices: {', '.join(names)}{hint}")
