"""Storage that fails under the CLI: a full disk (ENOSPC; a real tmpfs filled to the last byte where this machine
may mount one), a failing device (EIO), a folder without permission (EACCES) or over quota (EDQUOT), simulated by
the fault hooks. Each case: the exit code, one line naming the path and the cause, no traceback, and nothing
written before damaged. (A run's checkpoint, store and metrics writes are tests/faults/test_run_folder.py's.)
docs/reliability.md lists these promises."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import cli_env, full_disk, grpokit, hooked_env, kept, one_line, snapshot

ENOSPC_LINE = "No space left on device (ENOSPC); free some space there, or write to another folder"


def test_report_on_a_full_disk_goes_to_the_temporary_folder(finished_run, tmp_path):
    """report.html cannot be written in the run folder: the report goes to the temporary folder (exit 0, one line
    saying where), the run's old report.html stays whole and no temporary file is left."""
    disk = tmp_path / "disk"
    with full_disk(disk, holding=finished_run) as env:
        run = disk / "run"
        before = snapshot(run)
        proc = grpokit("report", run, env=env)
        assert kept(run, before)
    written = Path(proc.stdout.strip().removeprefix("wrote "))
    assert one_line(proc, 0) == (
        f"grpokit: {run / 'report.html'} cannot be written (No space left on device); wrote the report to {written} "
        "instead (--output FILE chooses where)"
    )
    assert "<svg" in written.read_text()
    written.unlink()


def test_report_output_on_a_full_disk(finished_run, tmp_path):
    """--output on a full disk: exit 2, one line naming the file and ENOSPC; the file there before is unchanged."""
    disk = tmp_path / "disk"
    with full_disk(disk) as env:
        target = disk / "report.html"
        proc = grpokit("report", finished_run, "--output", target, env=env)
        assert sorted(p.name for p in disk.iterdir() if p.name != ".filler") == []  # no report, no temporary file
    assert one_line(proc, 2) == f"grpokit: error: {target}: {ENOSPC_LINE}"


def test_inspect_into_a_full_disk(finished_run):
    """stdout on a full disk (/dev/full, which fails every write with ENOSPC, as a full disk does): exit 2, one line
    naming standard output and ENOSPC (not Python's 'Exception ignored' warning at exit and status 120)."""
    with open("/dev/full", "w") as full:
        proc = subprocess.run(
            [sys.executable, "-m", "grpokit", "inspect", str(finished_run), "--step", "1"],
            env=cli_env(),
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            timeout=600,
            check=False,
        )
    assert one_line(proc, 2) == f"grpokit: error: <standard output>: {ENOSPC_LINE}"


def test_inspect_into_a_closed_pipe(finished_run):
    """`grpokit inspect RUN | head`: the reader went away; exit 141 (a shell's status for SIGPIPE), nothing said."""
    read_end, write_end = os.pipe()
    os.close(read_end)  # every write to the pipe now fails with EPIPE
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "grpokit", "inspect", str(finished_run), "--step", "1"],
            env=cli_env(),
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=600,
            check=False,
        )
    finally:
        os.close(write_end)
    assert (proc.returncode, proc.stderr) == (141, "")


def test_train_into_a_full_disk(tmp_path, tiny_model_dir, finished_run):
    """A run whose output_dir is on a full disk: exit 2, one line naming a file in it and ENOSPC."""
    disk = tmp_path / "disk"
    config = yaml_config(finished_run, output_dir=disk / "run")
    with full_disk(disk) as env:
        proc = grpokit("train", config, env=env)
    line = one_line(proc, 2)
    assert line.startswith(f"grpokit: error: {disk / 'run'}") and "No space left on device" in line, line


def yaml_config(run: Path, **changes) -> Path:
    """The finished run's config.yaml with ``changes`` to its run section, written beside the test's folder."""
    import yaml

    config = yaml.safe_load((run / "config.yaml").read_text())
    config["run"].update({k: str(v) for k, v in changes.items()})
    path = Path(changes["output_dir"]).parent.parent / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.mark.parametrize(
    "code, words",
    [
        ("EIO", "Input/output error (EIO); the device or network mount failed; check the storage (dmesg), then retry"),
        (
            "EACCES",
            "Permission denied (EACCES); no permission there; change the folder's permissions or write to "
            "another folder",
        ),
        ("EDQUOT", "Disk quota exceeded (EDQUOT); free some of your quota there, or write to another folder"),
    ],
)
def test_report_output_on_failing_storage(finished_run, tmp_path, code, words):
    """Simulated by the fault hooks (no real failing device here): one line naming the file, the cause and what to
    do; the report that was there before is unchanged and no temporary file is left."""
    folder = tmp_path / "out"
    folder.mkdir()
    target = folder / "report.html"
    target.write_text("the report of yesterday")
    proc = grpokit(
        "report", finished_run, "--output", target, env=hooked_env(GRPOKIT_FAULT_WRITE_ERROR=f"{code}:{folder}")
    )
    assert one_line(proc, 2) == f"grpokit: error: {target}: {words}"
    assert target.read_text() == "the report of yesterday"
    assert [p.name for p in folder.iterdir()] == ["report.html"]


def test_a_run_folder_without_permission_sends_the_report_elsewhere(finished_run, tmp_path):
    """EACCES on the run folder (simulated: root ignores permissions): the report goes to the temporary folder."""
    env = hooked_env(GRPOKIT_FAULT_WRITE_ERROR=f"EACCES:{finished_run}")
    before = snapshot(finished_run)
    proc = grpokit("report", finished_run, env=env)
    assert kept(finished_run, before)
    line = one_line(proc, 0)
    assert line.startswith(f"grpokit: {finished_run / 'report.html'} cannot be written (Permission denied); wrote ")
    written = Path(proc.stdout.strip().removeprefix("wrote "))
    assert written.is_file() and written.parent == Path(os.environ.get("TMPDIR", "/tmp"))
    written.unlink()
