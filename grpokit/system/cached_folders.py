"""Folders built once and reused, named by a hash of the recipe that built them.

The examples keep their warm-started models this way: ``cached_folder(cache_dir, "policy", recipe, build)``
returns ``cache_dir/policy-<hash of recipe>``, calling ``build(folder)`` first when it is missing. The folder is
built under a temporary name beside it and renamed into place, and counts as built only with its
``recipe.json``, so an interrupted build is never taken as complete. A changed recipe gets a new folder.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

RECIPE_FILE = "recipe.json"


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
