"""Issue 43's size limits, kept by a test so a later merge cannot regress them silently: the loop
(train/loop.py) and TRL's trainer (trl/trainer.py) stay at most 300 lines each, and no function or method in
grpokit/train, grpokit/build or grpokit/trl is longer than 80 lines (decorators and docstring included)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "grpokit"
MAX_FILE_LINES = 300
LIMITED_FILES = ("train/loop.py", "trl/trainer.py")
MAX_FUNCTION_LINES = 80
LIMITED_PACKAGES = ("train", "build", "trl")


def long_functions(source: str, where: str, limit: int = MAX_FUNCTION_LINES) -> list[str]:
    """Every function (nested ones and methods too) of ``source`` longer than ``limit`` lines, as
    "where:line name (N lines)"."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            lines = node.end_lineno - first + 1
            if lines > limit:
                found.append(f"{where}:{node.lineno} {node.name} ({lines} lines)")
    return found


def test_the_loop_and_the_trl_trainer_stay_short():
    too_long = []
    for name in LIMITED_FILES:
        lines = len((PACKAGE / name).read_text().splitlines())
        if lines > MAX_FILE_LINES:
            too_long.append(f"grpokit/{name}: {lines} lines")
    assert not too_long, f"over {MAX_FILE_LINES} lines (move a cohesive piece into its own module): {too_long}"


def test_no_function_over_80_lines_in_train_build_trl():
    found = []
    for package in LIMITED_PACKAGES:
        for path in sorted((PACKAGE / package).rglob("*.py")):
            found += long_functions(path.read_text(), path.relative_to(PACKAGE.parent).as_posix())
    assert not found, f"functions over {MAX_FUNCTION_LINES} lines (split them): {found}"


def test_long_functions_counts_decorators_and_nested_functions():
    body = "".join(f"    x{i} = {i}\n" for i in range(78))  # def + 78 lines = 79; with the decorator 80
    source = f"@staticmethod\ndef f():\n{body}\nclass C:\n    def g(self):\n        def h():\n" + "".join(
        f"            y{i} = {i}\n" for i in range(80)
    )  # h: def + 80 lines = 81; g: 82
    assert long_functions(source, "m.py") == ["m.py:83 g (82 lines)", "m.py:84 h (81 lines)"]
    assert long_functions(source, "m.py", limit=79) == [
        "m.py:2 f (80 lines)",
        "m.py:83 g (82 lines)",
        "m.py:84 h (81 lines)",
    ]
