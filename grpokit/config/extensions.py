"""``algo.imports``: the user's modules, imported before the config is checked, so what they register counts.

A module named here runs once per process (dotted names through the import system, files by path under one
module name per path, as the reward files are loaded). A loss it registers (``grpokit.algos.register_loss``)
becomes a valid ``loss_type``; the training processes of a run (torchrun ranks) load the same config and import it
too.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from pathlib import Path

from grpokit.config.coerce import expand_path
from grpokit.config.schema import ConfigError


def import_modules(names: list) -> None:
    """Import each of ``names`` (``package.module`` or ``path/to/file.py``); a ConfigError naming the one that fails."""
    for name in names:
        if not isinstance(name, str) or not name:
            raise ConfigError(f"imports contains {name!r}; each entry is a module name or a path/to/file.py.")
        try:
            if name.endswith(".py") or "/" in name or "\\" in name:
                _import_file(expand_path(name))
            else:
                importlib.import_module(name)
        except ConfigError:
            raise
        except Exception as exc:  # the user's module: name it, with what went wrong
            raise ConfigError(f"imports: cannot import {name!r}: {type(exc).__name__}: {exc}") from exc


def _import_file(path: str) -> None:
    file = Path(path).resolve()
    if not file.is_file():
        raise ConfigError(f"imports: file {path!r} does not exist; give a path/to/file.py or a module name.")
    module_name = "_grpokit_import_" + hashlib.sha1(str(file).encode()).hexdigest()[:12]
    if module_name in sys.modules:
        return
    spec = importlib.util.spec_from_file_location(module_name, file)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # registered first, so dataclasses and pickling inside it work
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[module_name]
        raise
