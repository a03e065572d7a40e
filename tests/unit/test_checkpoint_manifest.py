"""A checkpoint's manifest: every kind of damage to a file is named; a write that fails on a full disk is one line
naming the file and ENOSPC, removes its temporary folder and leaves the earlier checkpoint as it was."""

from __future__ import annotations

import errno
import json

import pytest
import torch

from grpokit.train.rundir import checkpoint
from grpokit.train.rundir.checkpoint import CheckpointError, save_checkpoint, verify_checkpoint
from grpokit.train.rundir.manifest import MANIFEST, file_digest


def save(run, step: int = 1):
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 8)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    record = {"store": {"first": 1, "steps": step, "chain": "c"}, "metrics": None}
    return save_checkpoint(run, step, model, optimizer, scheduler, {}, {}, run_record=record)


def flip_bit(path, offset=None):
    data = bytearray(path.read_bytes())
    offset = len(data) // 2 if offset is None else offset
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


def test_the_manifest_lists_every_file_with_its_size_and_checksum(tmp_path):
    folder = save(tmp_path)
    manifest = json.loads((folder / MANIFEST).read_text())
    assert sorted(manifest["files"]) == ["model.safetensors", "states.pt", "trainer_state.json"]
    for name, entry in manifest["files"].items():
        assert (entry["bytes"], entry["sha256"]) == file_digest(folder / name)
    assert manifest["run"]["store"] == {"first": 1, "steps": 1, "chain": "c"}
    assert verify_checkpoint(folder) == manifest


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda f: (f / "states.pt").unlink(), r"states.pt is missing$"),
        (lambda f: (f / "model.safetensors").write_bytes(b""), r"model.safetensors is empty \(0 bytes, \d+ expected\)"),
        (
            lambda f: (f / "states.pt").write_bytes((f / "states.pt").read_bytes()[:100]),
            r"states.pt is truncated \(100 bytes, \d+ expected\)",
        ),
        (lambda f: flip_bit(f / "model.safetensors"), r"model.safetensors does not match its SHA-256 checksum"),
        (lambda f: flip_bit(f / "trainer_state.json", 3), r"trainer_state.json does not match its SHA-256 checksum"),
        (
            lambda f: (f / "states.pt").write_bytes((f / "states.pt").read_bytes() + b"x"),
            r"states.pt is longer than written",
        ),
        (lambda f: (f / MANIFEST).unlink(), r"manifest.json is missing \(the checkpoint is incomplete"),
        (lambda f: (f / MANIFEST).write_text("{"), r"manifest.json is unreadable"),
    ],
)
def test_damage_is_named(tmp_path, damage, message):
    folder = save(tmp_path)
    damage(folder)
    with pytest.raises(CheckpointError, match=rf"^checkpoint {folder} is damaged: {message}"):
        verify_checkpoint(folder)


def test_a_full_disk_while_saving_is_one_line_and_keeps_the_earlier_checkpoint(tmp_path, monkeypatch):
    """torch's writer hides the OSError behind a RuntimeError ('unexpected pos'); the message still names it."""
    first = save(tmp_path, step=1)
    before = {p.name: p.read_bytes() for p in first.iterdir()}

    def disk_full(obj, f):
        f.write(b"partial")
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError:
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534") from None

    monkeypatch.setattr(checkpoint.torch, "save", disk_full)
    with pytest.raises(CheckpointError) as caught:
        save(tmp_path, step=2)
    assert str(caught.value) == (
        f"cannot write checkpoint {tmp_path / 'checkpoints' / 'step-2'}: No space left on device (ENOSPC) while "
        "writing states.pt; checkpoint step-1 and the earlier steps are intact: fix that, then resume with "
        "resume_from=latest."
    )
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step-1"]  # no temporary folder left
    assert {p.name: p.read_bytes() for p in first.iterdir()} == before


@pytest.mark.parametrize(
    "error",
    [
        OSError(errno.ENOSPC, "No space left on device"),
        RuntimeError("Error while serializing: I/O error: No space left on device (os error 28)"),  # safetensors
    ],
)
def test_the_cause_of_a_failed_write_is_read_from_the_error(tmp_path, error):
    assert checkpoint._os_error(error, tmp_path) == "No space left on device (ENOSPC)"


def test_an_error_that_is_not_the_os_keeps_its_traceback(tmp_path, monkeypatch):
    monkeypatch.setattr(checkpoint.torch, "save", lambda obj, f: (_ for _ in ()).throw(ValueError("a bug")))
    with pytest.raises(ValueError, match="a bug"):
        save(tmp_path)


def test_the_final_model_is_whole_or_absent_and_a_full_disk_is_one_line(tmp_path, monkeypatch):
    model = torch.nn.Linear(4, 4)
    checkpoint.save_final_model(tmp_path / "final", model, None, is_main=True)
    before = (tmp_path / "final" / "model.safetensors").read_bytes()

    def disk_full(module, path):
        open(path, "wb").write(b"partial")  # noqa: SIM115
        raise RuntimeError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(checkpoint, "save_model", disk_full)
    with pytest.raises(CheckpointError) as caught:
        checkpoint.save_final_model(tmp_path / "final", model, None, is_main=True)
    assert str(caught.value) == (
        f"cannot write the final model {tmp_path / 'final'}: No space left on device (ENOSPC); the checkpoints are "
        "intact: fix that, then resume with resume_from=latest."
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["final"]  # no temporary folder left
    assert (tmp_path / "final" / "model.safetensors").read_bytes() == before  # the earlier final model, untouched
