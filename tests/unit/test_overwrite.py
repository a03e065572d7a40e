"""overwrite's previous run: set aside, then discarded (the new run is durable) or put back byte for byte (it is
not), and an overwrite killed at any rename is finished or undone by the next run (recover)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from grpokit.train.rundir import overwrite
from grpokit.train.rundir.overwrite import ASIDE, recover, set_aside


def snapshot(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` but the previous run set aside (relative path -> SHA-256)."""
    return {
        p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and ASIDE not in p.relative_to(folder).parts
    }


def previous_run(run: Path) -> None:
    (run / "checkpoints" / "step-2").mkdir(parents=True)
    (run / "checkpoints" / "step-2" / "model.safetensors").write_bytes(b"old weights")
    (run / "final").mkdir()
    (run / "final" / "model.safetensors").write_bytes(b"old final")
    (run / "config.yaml").write_text("old: config\n")
    (run / "rollouts.sqlite").write_bytes(b"old store")
    (run / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2}\n')
    (run / "notes.txt").write_text("the user's, never touched")


def new_run(run: Path) -> None:
    """What a new run writes before its first checkpoint (report.html: the old run had none)."""
    (run / "config.yaml").write_text("new: config\n")
    (run / "rollouts.sqlite").write_bytes(b"new store")
    (run / "metrics.jsonl").write_text('{"step": 0}\n')
    (run / "report.html").write_text("<html>new</html>")
    (run / "checkpoints").mkdir()
    (run / "checkpoints" / ".tmp-step-1").mkdir()


def test_a_failed_new_run_puts_the_previous_one_back_byte_for_byte(tmp_path):
    previous_run(tmp_path)
    before = snapshot(tmp_path)
    aside = set_aside(tmp_path)
    assert snapshot(tmp_path) == {"notes.txt": before["notes.txt"]}
    new_run(tmp_path)
    aside.restore()
    assert snapshot(tmp_path) == before
    assert not (tmp_path / ASIDE).exists() and not (tmp_path / "report.html").exists()


def test_a_durable_new_run_deletes_the_previous_one(tmp_path):
    previous_run(tmp_path)
    aside = set_aside(tmp_path)
    new_run(tmp_path)
    (tmp_path / "checkpoints" / "step-1").mkdir()
    aside.discard()
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "checkpoints",
        "config.yaml",
        "metrics.jsonl",
        "notes.txt",
        "report.html",
        "rollouts.sqlite",
    ]
    assert (tmp_path / "config.yaml").read_text() == "new: config\n"


def killed_after(monkeypatch, renames: int):
    """os.replace in overwrite works ``renames`` times, then the process 'dies' (raises)."""
    real, calls = os.replace, []

    def replace(src, dst):
        if len(calls) == renames:
            raise SystemExit("killed")
        calls.append(1)
        real(src, dst)

    monkeypatch.setattr(overwrite.os, "replace", replace)
    return lambda: monkeypatch.setattr(overwrite.os, "replace", real)


@pytest.mark.parametrize("renames", range(5))  # the previous run has five of RUN_FILES
def test_an_overwrite_killed_while_setting_aside_is_undone(tmp_path, monkeypatch, renames):
    previous_run(tmp_path)
    before = snapshot(tmp_path)
    revive = killed_after(monkeypatch, renames)
    with pytest.raises(SystemExit):
        set_aside(tmp_path)
    revive()
    recover(tmp_path)
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("renames", range(5))
def test_a_restore_killed_midway_is_finished_by_the_next_run(tmp_path, monkeypatch, renames):
    previous_run(tmp_path)
    before = snapshot(tmp_path)
    aside = set_aside(tmp_path)
    new_run(tmp_path)
    revive = killed_after(monkeypatch, renames)
    with pytest.raises(SystemExit):
        aside.restore()
    revive()
    assert "restored the previous run" in recover(tmp_path)
    assert snapshot(tmp_path) == before


def test_an_overwrite_killed_after_the_new_runs_first_checkpoint_keeps_the_new_run(tmp_path):
    previous_run(tmp_path)
    set_aside(tmp_path)
    new_run(tmp_path)
    (tmp_path / "checkpoints" / "step-1").mkdir()
    after = snapshot(tmp_path)
    assert recover(tmp_path) is None
    assert snapshot(tmp_path) == after and not (tmp_path / ASIDE).exists()
