"""The composition root hands each part its settings object (``compose.specs.part_settings``); functions that build
a spec are only those deriving values from several parts, at most 3 (issue 57)."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from grpokit.compose.specs import part_settings
from grpokit.config import GRPOConfig

COMPOSE = Path(__file__).resolve().parents[2] / "grpokit" / "compose"


def spec_builders() -> list[str]:
    """``module.function`` of every function of grpokit/compose/ named ``*_spec`` or returning a ``*Spec``."""
    found = []
    for path in sorted(COMPOSE.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                returns = ast.unparse(node.returns) if node.returns is not None else ""
                if node.name.endswith("_spec") or returns.endswith("Spec"):
                    found.append(f"{path.stem}.{node.name}")
    return found


def test_at_most_three_spec_building_functions():
    builders = spec_builders()
    # today: the learner's (loss, KL control, reference, memory), how rollouts become its inputs (off-policy
    # correction and the engine) and the loop's world-size-dependent values
    assert sorted(builders) == ["specs.learner_spec", "specs.loop_spec", "specs.update_inputs_spec"]


@dataclasses.dataclass
class _Toy:
    learning_rate: float
    made_up: int = 7  # no config key: keeps its default
    output_dir: str = "x"


def test_part_settings_fills_keys_keeps_defaults_of_non_keys_and_takes_derived():
    cfg = GRPOConfig(learning_rate=3e-4, output_dir="runs/a")
    assert part_settings(_Toy, cfg) == _Toy(3e-4, 7, "runs/a")
    assert part_settings(_Toy, cfg, made_up=1, output_dir="b") == _Toy(3e-4, 1, "b")


def test_part_settings_names_a_required_field_that_is_no_key():
    @dataclasses.dataclass
    class Broken:
        not_a_key: int

    with pytest.raises(AttributeError, match="not_a_key"):
        part_settings(Broken, GRPOConfig())
