"""The package's requirement ranges are the versions CI tests: every dependency pinned in constraints.txt (what
`make test` installs) or constraints-vllm.txt (what `make test-vllm` installs: vLLM's CPU build) has the oldest of
its pins as its lower bound in pyproject.toml, and the range admits every pin."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

tomllib = pytest.importorskip("tomllib", reason="tomllib is in the standard library from Python 3.11")
ROOT = Path(__file__).resolve().parents[2]


def pins(name: str = "constraints.txt") -> dict[str, Version]:
    out = {}
    for line in (ROOT / name).read_text().splitlines():
        match = re.match(r"^([A-Za-z0-9_.-]+)==([^\s;#]+)", line)
        if match:
            out[canonicalize_name(match.group(1))] = Version(match.group(2))
    return out


def requirements() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    listed = project["dependencies"] + [r for extra in project["optional-dependencies"].values() for r in extra]
    return [Requirement(r) for r in listed]


def test_every_pinned_requirement_starts_at_its_tested_version():
    environments = [pins("constraints.txt"), pins("constraints-vllm.txt")]
    checked = 0
    for req in requirements():
        tested = [env[canonicalize_name(req.name)] for env in environments if canonicalize_name(req.name) in env]
        if not tested:
            continue  # not installed by CI (vllm: CUDA only), nothing tested to match
        for pin in tested:
            assert req.specifier.contains(pin, prereleases=True), f"{req} excludes the tested {req.name}=={pin}"
        lower = [Version(s.version) for s in req.specifier if s.operator == ">="]
        assert lower == [min(tested)], f"{req}: its lower bound must be the oldest tested version {min(tested)}"
        checked += 1
    assert checked >= 20


def test_transformers_stops_before_the_release_that_drops_past_key_values():
    (transformers,) = [r for r in requirements() if r.name == "transformers"]
    assert not transformers.specifier.contains("5.40.0")
