"""Each config key's default is written once (issue 49): an AST count over grpokit/ of the dataclass fields that
carry a default and are named as a config key. A part's settings class holds its keys' defaults and the config
section is assembled from it (``AlgoConfig(SapoParams, VespoParams)``); a spec the composition root derives from the
config (``LossSpec``, ``SamplingParams``, ``LearnerSpec`` ...) has no defaults of its own, so the two cannot drift.

grpokit/demo/ is left out: its ``WarmStartConfig`` is the demo's own recipe for warm-starting a toy model (its
``learning_rate`` and ``seed`` are the recipe's, not a run's)."""

from __future__ import annotations

import ast
import dataclasses
from collections import defaultdict
from pathlib import Path

from grpokit.config.sections import SECTIONS

PACKAGE = Path(__file__).resolve().parents[2] / "grpokit"
NOT_SETTINGS = ("demo",)


def _is_dataclass(node: ast.ClassDef) -> bool:
    def name(decorator):
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        return target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")

    return any(name(d) == "dataclass" for d in node.decorator_list)


def defaults_by_key(package: Path, keys: set[str]) -> dict[str, list[str]]:
    """{config key: the dataclasses ("path:Class") that write a default for a field of that name}."""
    found = defaultdict(list)
    for path in sorted(package.rglob("*.py")):
        if path.relative_to(package).parts[0] in NOT_SETTINGS:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and _is_dataclass(node):
                for stmt in node.body:
                    if isinstance(stmt, ast.AnnAssign) and stmt.value is not None and stmt.target.id in keys:
                        found[stmt.target.id].append(f"{path.relative_to(package.parent)}:{node.name}")
    return found


def config_keys() -> set[str]:
    return {f.name for section in SECTIONS.values() for f in dataclasses.fields(section)}


def test_no_config_key_has_its_default_written_twice():
    found = defaults_by_key(PACKAGE, config_keys())
    twice = {key: where for key, where in found.items() if len(where) > 1}
    assert not twice, "defaults written in more than one dataclass (keep the part's, derive the rest):\n" + "\n".join(
        f"  {key}: {', '.join(where)}" for key, where in sorted(twice.items())
    )


def test_every_config_key_has_a_default_somewhere():
    """The count above sees the defaults it should: every key's default is found in exactly one dataclass."""
    found = defaults_by_key(PACKAGE, config_keys())
    assert set(found) == config_keys()


def test_the_count_finds_a_second_default(tmp_path):
    """A planted mirror spec with a default of its own is found (the check can fail)."""
    (tmp_path / "grpokit").mkdir()
    (tmp_path / "grpokit" / "part.py").write_text(
        "from dataclasses import dataclass\n\n@dataclass\nclass Spec:\n    beta: float = 0.0\n    other: int = 1\n"
    )
    (tmp_path / "grpokit" / "config.py").write_text(
        "import dataclasses\n\n@dataclasses.dataclass\nclass AlgoConfig:\n    beta: float = 0.04\n"
    )
    assert defaults_by_key(tmp_path / "grpokit", {"beta"}) == {
        "beta": ["grpokit/config.py:AlgoConfig", "grpokit/part.py:Spec"]
    }
