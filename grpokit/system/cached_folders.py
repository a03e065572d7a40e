"""Folders built once and reused, named by a hash of the recipe that built them.

The examples keep their warm-started models this way: ``cached_folder(cache_dir, "policy", recipe, build)``
returns ``cache_dir/policy-<hash of recipe>``, calling ``build(folder)`` first when it is missing. The folder is
built under a temporary name beside it and renamed into place, and counts as built only with its
``recipe.json``, so an interrupted build is never taken as complete. A changed recipe gets a new folder.

The folder itself is :func:`default_cache_root`; :func:`write_atomic` writes a small file there (the CPU probe's
measurements, :mod:`grpokit.kernels.cpu_precision`) so that a process killed while writing leaves the old file or none.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

RECIPE_FILE = "recipe.json"


def default_cache_root() -> Path:
    """``$GRPOKIT_CACHE``, else ``$XDG_CACHE_HOME/grpokit``, else ``~/.cache/grpokit``."""
    if os.environ.get("GRPOKIT_CACHE"):
        return Path(os.environ["GRPOKIT_CACHE"]).expanduser()
    if os.environ.get("XDG_CACHE_HOME"):
        return Path(os.environ["XDG_CACHE_HOME"]).expanduser() / "grpokit"
    return Path.home() / ".cache" / "grpokit"


def write_atomic(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file beside it (flushed to disk, then renamed over it): a
    reader sees the old file or the whole new one, never a part, even when this process is killed meanwhile."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}-")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def keyed_file(folder: str | Path, key: dict) -> Path:
    """``folder/<first 16 hex digits of sha256(key as sorted JSON)>.json``: a measurement's file, named by what it
    was measured for."""
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return Path(folder) / f"{digest}.json"


def read_keyed(path: Path, key: dict, check: Callable[[dict], None], what: str) -> dict | None:
    """The JSON entry at ``path`` measured for ``key`` (``check(entry)`` raises ValueError, KeyError or TypeError
    when its values are not usable), or None: no file, or one that is not ``what`` (named in one line on stderr;
    the caller measures again and replaces it)."""
    if not path.is_file():
        return None
    try:
        entry = json.loads(path.read_text())
        if entry["key"] != key:
            raise ValueError("it was measured for another machine or model")
        check(entry)
        return entry
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(f"grpokit: ignoring {path}, not {what} ({exc}); measuring again", file=sys.stderr)
        return None


def cached_folder(cache_dir: str | Path, kind: str, recipe: dict, build: Callable[[Path], None]) -> Path:
    """``cache_dir/<kind>-<first 12 hex digits of sha256(recipe as sorted JSON)>``, built by ``build(tmp)`` first
    when it has no ``recipe.json`` (``build`` writes the folder's files into the empty folder it is given)."""
    key = hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:12]
    folder = Path(cache_dir) / f"{kind}-{key}"
    if (folder / RECIPE_FILE).is_file():
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{kind}-"))
    try:
        build(tmp)
        (tmp / RECIPE_FILE).write_text(json.dumps(recipe, indent=2))
        shutil.rmtree(folder, ignore_errors=True)  # a partial folder from an older, interrupted build
        os.replace(tmp, folder)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder
