"""A copy of the grpokit package to extend as a contributor would, for the tests of the extension points
(tests/integration/test_setting_extension.py, tests/integration/test_extend_*.py): edit or add its files, ask which
files differ from the package (:meth:`PackageCopy.changed`), and run Python or ``grpokit`` on the copy in a
subprocess (its folder first on PYTHONPATH). The ``package_copy`` fixture (tests/conftest.py) makes one per test
module.

A module of its own (not ``conftest``, like shared_helpers.py), so that ``from package_copy import ...`` finds it.
"""

from __future__ import annotations

import filecmp
import re
import shutil
import subprocess
import sys
from pathlib import Path

from shared_helpers import cli_env

import grpokit

PACKAGE = Path(grpokit.__file__).parent
PAGE = PACKAGE.parent / "docs" / "architecture.md"
# Regenerates typed_keys.py in the copy, as scripts/gen_config_reference.py does in the repository (docs/config.md,
# the script's other output, lies outside the package).
REGENERATE = """
from pathlib import Path
import grpokit
from grpokit.config.reference import typed_keys_source
(Path(grpokit.__file__).parent / "config" / "typed_keys.py").write_text(typed_keys_source())
"""

# Runs ``grpokit.cli.main(argv)`` (what ``python -m grpokit`` runs) for each argv of a JSON list, in one interpreter
# (one import of torch), printing each exit status; first checks that grpokit is the copy's.
CLI_RUNS = """
import json, sys
import grpokit
from grpokit.cli import main
assert grpokit.__file__.startswith(sys.argv[1]), f"not the copy: {grpokit.__file__}"
for argv in json.loads(sys.argv[2]):
    print("exit", main(argv), flush=True)
"""


class PackageCopy:
    """grpokit copied to ``root``/grpokit (its bytecode caches too, which stay valid for the files not edited)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.package = root / "grpokit"
        shutil.copytree(PACKAGE, self.package)

    def edit(self, path: str, *replacements: tuple[str, str]) -> None:
        """Replace each ``(old, new)`` in the copy's ``path`` (relative to the package); each ``old`` must occur
        exactly once, so the file still reads as the test expects."""
        file = self.package / path
        text = file.read_text()
        for old, new in replacements:
            assert text.count(old) == 1, f"{path}: {old!r} occurs {text.count(old)} times"
            text = text.replace(old, new)
        file.write_text(text)

    def add(self, path: str, text: str) -> None:
        """A new file of the copy (relative to the package); it must not exist yet."""
        file = self.package / path
        assert not file.exists(), path
        file.write_text(text)

    def changed(self) -> set[str]:
        """The copy's files (relative to the package) that differ from the package's, added or removed; bytecode
        caches ignored."""
        return set(_differences(PACKAGE, self.package))

    def env(self, **extra: str) -> dict:
        """A subprocess's environment: offline, the copy first on PYTHONPATH, ``extra`` added."""
        return cli_env(self.root, **extra)

    def python(self, *args, cwd=None, timeout: float = 600) -> subprocess.CompletedProcess:
        """``python ARGS`` on the copy (``-c CODE ...``, ``-m grpokit ...``), output captured as text."""
        command = [sys.executable, *map(str, args)]
        return subprocess.run(
            command, env=self.env(), cwd=cwd or self.root, capture_output=True, text=True, timeout=timeout
        )

    def cli_runs(self, *argvs: list, cwd=None) -> tuple[list[int], str]:
        """``grpokit ARGV`` for each of ``argvs`` on the copy, in one subprocess (``grpokit.cli.main``, which
        ``python -m grpokit`` calls): (their exit statuses, the subprocess's stderr)."""
        import json

        argvs = [[str(arg) for arg in argv] for argv in argvs]
        out = self.python("-c", CLI_RUNS, self.package, json.dumps(argvs), cwd=cwd)
        assert out.returncode == 0, out.stderr[-3000:]
        codes = [int(line.split()[1]) for line in out.stdout.splitlines() if line.startswith("exit ")]
        return codes, out.stderr

    def regenerate_typed_keys(self) -> None:
        """``python scripts/gen_config_reference.py``'s typed_keys.py, written into the copy from its own config."""
        out = self.python("-c", REGENERATE)
        assert out.returncode == 0, out.stderr[-3000:]


def page_says(kind: str) -> str:
    """docs/architecture.md's "Where a new thing goes" entry for ``kind`` (``a loss``, ``an engine`` ...): the text of
    its bullet, lines joined."""
    text = PAGE.read_text()
    section = text.split("## Where a new thing goes", 1)[1]
    found = re.search(rf"^- \*\*{re.escape(kind)}\*\*(.*?)(?=^- \*\*|\Z)", section, re.S | re.M | re.I)
    assert found, f"docs/architecture.md has no entry for {kind!r} under 'Where a new thing goes'"
    return " ".join(found.group(1).split())


def assert_changes_are_the_pages(copy: PackageCopy, kind: str, expected: set[str]) -> None:
    """The files ``copy`` changed are ``expected`` (relative to the package), and docs/architecture.md's entry for
    ``kind`` names each: an edited file by its path, an added module by its folder (``a module of grpokit/algos/``)."""
    assert copy.changed() == expected
    says = page_says(kind)
    for path in sorted(expected):
        named = f"grpokit/{path}" if (PACKAGE / path).exists() else f"a module of grpokit/{Path(path).parent}/"
        assert named in says, f"docs/architecture.md's entry for {kind!r} does not name {named}"


def _differences(a: Path, b: Path, prefix: str = "") -> list[str]:
    """Files whose content differs between the trees ``a`` and ``b`` (relative paths), caches ignored."""
    cmp = filecmp.dircmp(a, b, ignore=["__pycache__"])
    found = [prefix + name for name in cmp.left_only + cmp.right_only]
    found += [prefix + name for name in cmp.common_files if not filecmp.cmp(a / name, b / name, shallow=False)]
    for sub in cmp.common_dirs:
        found += _differences(a / sub, b / sub, f"{prefix}{sub}/")
    return sorted(found)
