"""A package's names imported on first use (PEP 562): its ``__init__`` stays light, so a torch-free module of the
package (its settings) can be imported by the config without loading the rest."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def lazy_names(package: str, where: dict[str, str]) -> Callable[[str], Any]:
    """The ``__getattr__`` of ``package`` that imports each name of ``where`` ({name: submodule}) when first read."""

    def __getattr__(name: str) -> Any:
        if name not in where:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(f"{package}.{where[name]}"), name)

    return __getattr__
