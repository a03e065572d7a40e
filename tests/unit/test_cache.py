"""grpokit.system.cached_folders.cached_folder: built once per recipe, never reused half-built."""

from __future__ import annotations

import pytest

from grpokit.system.cached_folders import cached_folder


def test_a_folder_is_built_once_per_recipe(tmp_path):
    calls = []

    def build(folder):
        calls.append(folder)
        (folder / "model.bin").write_text("weights")

    first = cached_folder(tmp_path / "cache", "policy", {"steps": 10}, build)
    again = cached_folder(tmp_path / "cache", "policy", {"steps": 10}, build)
    assert first == again and len(calls) == 1 and (first / "model.bin").read_text() == "weights"
    assert first.name.startswith("policy-") and (first / "recipe.json").is_file()
    other = cached_folder(tmp_path / "cache", "policy", {"steps": 20}, build)  # another recipe: another folder
    assert other != first and len(calls) == 2


def test_an_interrupted_build_leaves_nothing_that_counts_as_built(tmp_path):
    def broken(folder):
        (folder / "model.bin").write_text("half")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        cached_folder(tmp_path, "policy", {"steps": 10}, broken)
    assert list(tmp_path.iterdir()) == []  # the temporary folder is gone, no policy-* folder
    built = cached_folder(tmp_path, "policy", {"steps": 10}, lambda folder: (folder / "model.bin").write_text("ok"))
    assert (built / "model.bin").read_text() == "ok"
