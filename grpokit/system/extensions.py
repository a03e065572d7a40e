"""``algo.imports``: the user's modules, imported before the config is checked, so what they register counts; and
:func:`import_failure`, the one line for a user's module or file that raises while imported (here, and for the
reward, tool, environment and tool-parser specs of ``grpokit.rewards.resolve``).

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
import traceback
from pathlib import Path

from grpokit.errors import ConfigError
from grpokit.system.paths import expand_path


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
        except ImportError as exc:
            if exc.name is not None and (name + ".").startswith(exc.name + "."):  # the module itself is missing
                raise ConfigError(f"imports: cannot import {name!r}: {type(exc).__name__}: {exc}") from exc
            raise ConfigError(f"imports: {import_failure(exc, module_file(name))}") from exc
        except (Exception, SystemExit) as exc:  # the user's module: its file, line and what went wrong
            raise ConfigError(f"imports: {import_failure(exc, module_file(name))}") from exc


def module_file(name: str) -> str | None:
    """The file of ``name`` (a path/to/file.py, or a module found without importing it), or None."""
    if name.endswith(".py") or "/" in name or "\\" in name:
        return str(Path(expand_path(name)).resolve())
    try:
        spec = importlib.util.find_spec(name)
    except (Exception, SystemExit):
        return None
    return spec.origin if spec is not None and spec.has_location else None


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


def import_failure(exc: BaseException, path: str | None = None) -> str:
    """One line for ``exc``, raised while importing the file ``path`` (None: a module whose file is unknown):
    ``FILE:LINE (CODE) raised TYPE at import: MESSAGE``. The line is the innermost of ``path``'s own lines in the
    traceback (without ``path``: the innermost frame that is not importlib's), so an error inside a library the
    file imports points at the file's import of it; a SyntaxError gives the line it could not parse."""
    message = str(exc)
    if isinstance(exc, SyntaxError) and exc.filename:
        filename, lineno, code, message = exc.filename, exc.lineno, exc.text, exc.msg
    else:
        filename = lineno = code = None
        for entry in traceback.extract_tb(exc.__traceback__):
            if entry.filename == path if path is not None else not entry.filename.startswith("<frozen"):
                filename, lineno, code = entry.filename, entry.lineno, entry.line
    if isinstance(exc, SystemExit):
        message = f"exit code {exc.code!r}; a file that exits when imported: guard that with if __name__ == '__main__'"
    lines = message.strip().splitlines()
    message = lines[0] + (" ..." if len(lines) > 1 else "") if lines else ""  # one line, however long the message
    where = f"{filename}:{lineno}" if filename else (path or "the module")
    code = (code or "").strip()
    where += f" ({code[:80]})" if code else ""
    return f"{where} raised {type(exc).__name__} at import" + (f": {message}" if message else "")
