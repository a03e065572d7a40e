"""The run folder at the edges of a run: one writer at a time, overwrite that never destroys before the new run is
durable, resume that checks what it resumes, and resume after a stop at step 0, while saving, or on a full disk.

Every case checks the exit code, one line from grpokit and no traceback, that the folder is unchanged where that is
promised, and that a resumed run equals an uninterrupted one (metrics.jsonl and the stored rows) where that is
promised. docs/reliability.md lists the promises and the test that holds each one."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from faults.conftest import (
    EVAL,
    WRONG_LENGTH,
    cli_env,
    grpokit,
    grpokit_lines,
    one_line,
    snapshot,
    write_config,
)
from grpokit import GRPOTrainer
from grpokit.cli import main
from grpokit.config import load_config
from grpokit.rewards.contract import RewardError
from grpokit.store import RolloutStore
from grpokit.system.run_lock import LOCK_FILE, RunFolderError
from grpokit.train.rundir.checkpoint import list_checkpoints, verify_checkpoint

pytestmark = pytest.mark.usefixtures("one_thread")
THREADS = {"OMP_NUM_THREADS": "1"}  # subprocesses compute as the one-thread runs of this process do
# Per-step numbers that must agree between an interrupted-then-resumed run and an uninterrupted one.
COMPARED = ("loss", "kl", "reward", "grad_norm", "entropy", "learning_rate", "completion_length/mean")


def metric_lines(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def stored(run: Path) -> tuple[list[tuple], list[dict]]:
    with RolloutStore(run / "rollouts.sqlite", readonly=True) as store:
        rows = [
            (r["step"], r["prompt_index"], r["completion_index"], r["completion"], r["reward"], r["advantage"])
            for r in store.rollouts()
        ]
        return rows, store.evals()


# An evaluation's wall-clock figures (TRL's eval_runtime, eval_samples_per_second, eval_steps_per_second).
TIMINGS = ("runtime", "samples_per_second", "steps_per_second")


def _compared(key: str) -> bool:
    return key in COMPARED or (key.startswith("eval/") and not key.endswith(TIMINGS))


def assert_same_run(run: Path, reference: Path) -> None:
    """metrics.jsonl (every step and evaluation line, in order) and the stored rollouts and evaluations agree, except
    wall-clock figures."""
    got, want = metric_lines(run), metric_lines(reference)
    assert [m["step"] for m in got] == [m["step"] for m in want]
    for a, b in zip(got, want):
        keys = [k for k in b if _compared(k)]
        assert keys and sorted(keys) == sorted(k for k in a if _compared(k)), b
        for key in keys:
            assert a[key] == pytest.approx(b[key], abs=1e-6), (b["step"], key)
    rows, evals = stored(run)
    want_rows, want_evals = stored(reference)
    assert rows == want_rows
    assert [(e["step"], e["dataset"]) for e in evals] == [(e["step"], e["dataset"]) for e in want_evals]
    for a, b in zip(evals, want_evals):
        assert {k: v for k, v in a.items() if k != "dataset" and not k.endswith(TIMINGS)} == pytest.approx(
            {k: v for k, v in b.items() if k != "dataset" and not k.endswith(TIMINGS)}
        )


def train_in_process(config: Path, *overrides: str) -> None:
    assert main(["train", str(config), *overrides]) == 0


# ---- fixtures: finished and uninterrupted runs --------------------------------------------------------------------
@pytest.fixture(scope="module")
def finished(tmp_path_factory, tiny_model_dir):
    """A finished run of 2 steps (checkpoints step-1 and step-2, final/), and the same config run for 3 steps at
    once."""
    folder = tmp_path_factory.mktemp("finished")
    config = write_config(folder, tiny_model_dir, max_steps=2)
    train_in_process(config)
    reference = tmp_path_factory.mktemp("straight-3")
    train_in_process(write_config(reference, tiny_model_dir, max_steps=3))
    return folder, reference / "run"


@pytest.fixture()
def run_copy(finished, tmp_path, tiny_model_dir):
    """A copy of the finished run in tmp_path/run, with its config at tmp_path/config.yaml."""
    folder, _ = finished
    shutil.copytree(folder / "run", tmp_path / "run")
    return write_config(tmp_path, tiny_model_dir, max_steps=2), tmp_path / "run"


# ---- one writer per run folder ------------------------------------------------------------------------------------
def start_gated(config: Path, gate: Path, *overrides: str) -> subprocess.Popen:
    """`grpokit train` held inside step 1 (its reward waits for gate/open) once gate/ready exists."""
    gate.mkdir()
    proc = subprocess.Popen(
        [sys.executable, "-m", "grpokit.cli", "train", str(config), *overrides],
        env=cli_env(GRPOKIT_FAULT_GATE=str(gate), **THREADS),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 600
    while not (gate / "ready").exists():
        assert proc.poll() is None, proc.stderr.read()[-3000:]
        assert time.monotonic() < deadline, "the gated run never reached its reward"
        time.sleep(0.1)
    return proc


@pytest.mark.slow  # 85 s measured on two shared cores (three processes); tests/unit/test_run_lock.py is quick
def test_a_second_writer_is_refused_at_once_and_the_first_run_is_untouched(tmp_path, tiny_model_dir):
    """While a run trains, a second `grpokit train` on its folder (plain, overwrite) and a GRPOTrainer (fresh or
    resuming at construction, or at train() when it was built before the folder was taken) are refused with one line
    naming the holder's PID and host; the first run then finishes as if alone."""
    config = write_config(tmp_path, tiny_model_dir, max_steps=2)
    run = tmp_path / "run"
    late = GRPOTrainer(args=load_config(config))  # built while the folder is free
    first = start_gated(config, tmp_path / "gate")
    try:
        holder = f"(PID {first.pid} on host {socket.gethostname()} (since "
        for overrides in ([], ["overwrite=true"]):
            line = one_line(grpokit("train", config, *overrides, env=cli_env(**THREADS)), 2)
            assert line.startswith(f"grpokit: error: output_dir '{run}' is in use by another grpokit run {holder}")
            assert line.endswith("wait for it to finish or stop it, or choose another output_dir.")
        for resuming in (None, "latest"):
            with pytest.raises(RunFolderError, match=rf"PID {first.pid} on host"):
                GRPOTrainer(args=load_config(config).replace(resume_from=resuming))
        with pytest.raises(RunFolderError, match=rf"PID {first.pid} on host"):
            late.train()
        late.rewards.close()
    finally:
        (tmp_path / "gate" / "open").touch()
        assert first.wait(timeout=600) == 0, first.stderr.read()[-3000:]
    assert "error" not in first.stderr.read()
    assert [m["step"] for m in metric_lines(run)] == [1, 2]
    assert [s for s, *_ in stored(run)[0]][::8] == [1, 2]  # 8 rollouts a step, written once
    assert [p.name for p in list_checkpoints(run)] == ["step-1", "step-2"] and (run / "final").is_dir()


def test_a_killed_overwrite_leaves_a_stale_lock_and_the_previous_run_which_the_next_run_resumes(
    run_copy, finished, tmp_path
):
    """kill -9 of a run overwriting a finished one, inside its step 1: the lock dies with it (the file still names
    it), the previous run is aside. The next `resume_from=latest` takes the lock over, puts the previous run back
    (saying so) and continues it exactly."""
    config, run = run_copy
    killed = start_gated(config, tmp_path / "gate", "overwrite=true")
    killed.send_signal(signal.SIGKILL)
    killed.wait(timeout=60)
    assert (run / LOCK_FILE).read_text().split()[0] == str(killed.pid)
    assert sorted(p.name for p in (run / ".overwritten" / "checkpoints").iterdir()) == ["step-1", "step-2"]
    proc = grpokit("train", config, "resume_from=latest", "max_steps=3", env=cli_env(**THREADS))
    assert one_line(proc, 0) == (
        f"grpokit: restored the previous run in {run}: the run that was overwriting it stopped before its first "
        "checkpoint"
    )
    pid, host = (run / LOCK_FILE).read_text().split()[:2]
    assert pid != str(killed.pid) and host == socket.gethostname()  # the lock was taken over
    assert not (run / ".overwritten").exists()
    assert_same_run(run, finished[1])


# ---- overwrite ----------------------------------------------------------------------------------------------------
def test_overwrite_by_a_run_that_fails_at_step_1_puts_the_previous_run_back_byte_for_byte(run_copy):
    config, run = run_copy
    before = snapshot(run)
    proc = grpokit("train", config, "overwrite=true", f"rewards=['{WRONG_LENGTH}']", env=cli_env(**THREADS))
    assert "wrong_length" in one_line(proc, 2)  # the reward contract's one line
    assert snapshot(run) == before


def test_overwrite_through_the_trainer(run_copy, tiny_model_dir):
    """GRPOTrainer: a new run stopped by SIGTERM at its step-0 evaluation, and one whose reward breaks the contract,
    leave the previous run as it was; a run that succeeds deletes it at its first checkpoint, not before."""
    config, run = run_copy
    before = snapshot(run)
    args = load_config(config).replace(overwrite=True)
    evaluating = {"eval_dataset": args.train_dataset, "eval_steps": 1, "max_eval_prompts": 2, "pass_at_k": [1]}
    stopped = GRPOTrainer(args=args.replace(**evaluating, num_generations_eval=2))
    evaluate = stopped.evaluate
    stopped.evaluate = lambda: (os.kill(os.getpid(), signal.SIGTERM), evaluate())[1]
    stopped.train()
    assert stopped.interrupted_by == signal.SIGTERM and stopped.step == 0
    assert snapshot(run) == before
    with pytest.raises(RewardError):
        GRPOTrainer(reward_funcs=[WRONG_LENGTH], args=args).train()
    assert snapshot(run) == before

    from transformers import TrainerCallback

    seen = []

    class Watch(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            seen.append(("step", state.global_step, (run / ".overwritten").is_dir()))

        def on_save(self, args, state, control, **kwargs):
            seen.append(("save", state.global_step, (run / ".overwritten").is_dir()))

    GRPOTrainer(args=args.replace(max_steps=1), callbacks=[Watch()]).train()
    assert seen == [("step", 1, True), ("save", 1, False)]  # aside until the first checkpoint is on disk
    assert [m["step"] for m in metric_lines(run)] == [1]
    assert [p.name for p in list_checkpoints(run)] == ["step-1"]


# ---- resume checks what it resumes --------------------------------------------------------------------------------
def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def empty(path: Path) -> None:
    path.write_bytes(b"")


def flip_bit(path: Path, needle: bytes | None = None) -> None:
    """One bit changed: in the middle of the file, or in the first occurrence of ``needle`` (a stored value)."""
    data = bytearray(path.read_bytes())
    data[len(data) // 2 if needle is None else data.index(needle)] ^= 0x01
    path.write_bytes(bytes(data))


DAMAGE = {"empty": empty, "truncated": truncate, "bit-flipped": flip_bit}


@pytest.mark.parametrize(
    "file, how, message",
    [
        ("model.safetensors", "empty", r"model.safetensors is empty \(0 bytes, \d+ expected\)"),
        ("states.pt", "truncated", r"states.pt is truncated \(\d+ bytes, \d+ expected\)"),
        ("model.safetensors", "bit-flipped", "model.safetensors does not match its SHA-256 checksum"),
    ],
)
def test_latest_skips_a_damaged_checkpoint_and_says_so(run_copy, finished, capsys, file, how, message):
    config, run = run_copy
    DAMAGE[how](run / "checkpoints" / "step-2" / file)
    train_in_process(config, "resume_from=latest", "max_steps=3")
    [line] = grpokit_lines(capsys.readouterr().err)
    assert line.startswith(f"grpokit: checkpoint {run / 'checkpoints' / 'step-2'} is damaged: ")
    assert line.endswith("; resuming from step-1, the newest intact checkpoint")
    assert re.search(message, line), line
    assert_same_run(run, finished[1])


def refused(config: Path, capsys, *overrides: str) -> str:
    assert main(["train", str(config), *overrides]) == 2
    [line] = grpokit_lines(capsys.readouterr().err)
    return line


def test_a_damaged_checkpoint_given_by_path_is_refused_and_nothing_changes(run_copy, capsys):
    config, run = run_copy
    truncate(run / "checkpoints" / "step-2" / "model.safetensors")
    before = snapshot(run)
    line = refused(config, capsys, f"resume_from={run / 'checkpoints' / 'step-2'}", "max_steps=3")
    assert line.startswith(f"grpokit: error: checkpoint {run / 'checkpoints' / 'step-2'} is damaged: model.safetensors")
    assert line.endswith("resume from another checkpoint (resume_from=latest picks the newest intact one).")
    assert snapshot(run) == before


def test_no_intact_checkpoint_at_all_is_refused(run_copy, capsys):
    config, run = run_copy
    for folder in list_checkpoints(run):
        flip_bit(folder / "states.pt")
    before = snapshot(run)
    line = refused(config, capsys, "resume_from=latest", "max_steps=3")
    assert line.startswith("grpokit: error: no intact checkpoint to resume from: checkpoint ")
    assert (
        "step-2 is damaged: states.pt does not match its SHA-256 checksum (corrupted) (and 1 older, all damaged)"
        in line
    )
    assert snapshot(run) == before


@pytest.mark.parametrize(
    "how, message",
    [
        ("missing", "is missing, but checkpoint step-2 needs its steps 1..2"),
        ("empty", r"is empty \(0 bytes\), but checkpoint step-2 needs its steps 1..2"),
        ("truncated", r"is damaged \("),
        ("bit-flipped", "does not hold what checkpoint step-2 recorded of its steps 1..2"),
    ],
)
def test_a_damaged_store_is_refused_and_never_recreated(run_copy, capsys, how, message):
    config, run = run_copy
    store = run / "rollouts.sqlite"
    if how == "missing":
        store.unlink()
    elif how == "bit-flipped":
        with sqlite3.connect(store) as db:
            completion = db.execute("SELECT completion FROM rollouts WHERE step = 2 LIMIT 1").fetchone()[0]
        flip_bit(store, completion.encode())  # a stored completion, the file's structure intact
    else:
        DAMAGE[how](store)
    before = snapshot(run)
    line = refused(config, capsys, "resume_from=latest", "max_steps=3")
    assert line.startswith(f"grpokit: error: {store} ")
    assert re.search(message, line), line
    assert snapshot(run) == before  # a missing or empty store stays so: never recreated under the checkpoints


@pytest.mark.parametrize(
    "how, message",
    [
        ("missing", "is missing, but checkpoint step-2 recorded"),
        ("empty", r"is empty \(0 bytes\), but checkpoint step-2 recorded"),
        ("truncated", r"is truncated \(\d+ bytes\), but checkpoint step-2 recorded"),
        ("bit-flipped", r"does not match what checkpoint step-2 recorded of it \(its SHA-256 differs"),
    ],
)
def test_a_damaged_metrics_file_is_refused(run_copy, capsys, how, message):
    config, run = run_copy
    metrics = run / "metrics.jsonl"
    if how == "missing":
        metrics.unlink()
    else:
        DAMAGE[how](metrics)
    before = snapshot(run)
    line = refused(config, capsys, "resume_from=latest", "max_steps=3")
    assert line.startswith(f"grpokit: error: {metrics} ")
    assert re.search(message, line), line
    assert snapshot(run) == before


# ---- resume from any interruption ---------------------------------------------------------------------------------
# `grpokit train` with a patch: at the CALL-th call of TARGET ("module:Class.method" or "module:function") it sends
# itself SIGTERM, then runs the real code.
SIGTERM_DRIVER = """
import importlib, os, signal, sys
module, path = sys.argv[1].split(":")
owner = importlib.import_module(module)
*parents, name = path.split(".")
for part in parents:
    owner = getattr(owner, part)
real, calls = getattr(owner, name), []
def patched(*args, **kwargs):
    calls.append(1)
    if len(calls) == int(sys.argv[2]):
        os.kill(os.getpid(), signal.SIGTERM)
    return real(*args, **kwargs)
setattr(owner, name, patched)
from grpokit.cli import main
sys.exit(main(["train", *sys.argv[3:]]))
"""


@pytest.fixture(scope="module")
def straight_with_eval(tmp_path_factory, tiny_model_dir):
    """An uninterrupted 2-step run that evaluates before, during and after training."""
    folder = tmp_path_factory.mktemp("straight-eval")
    config = write_config(folder, tiny_model_dir, max_steps=2)
    train_in_process(config, *[x.format(data=folder / "train.jsonl") for x in EVAL])
    return folder / "run"


@pytest.mark.parametrize(
    "target, stop_line",
    [
        (
            "grpokit.trl.trainer:GRPOTrainer.evaluate",  # its first call: the evaluation before step 1
            "stopped at step 0: received SIGTERM before the first step finished; there was nothing to save",
        ),
        (
            "grpokit.train.rundir.checkpoint:save_checkpoint",  # its first call: the first checkpoint, step 1's
            "stopped at step 1: received SIGTERM; saved checkpoint step-1, resume with resume_from=latest",
        ),
    ],
    ids=["step-0-evaluation", "first-checkpoint"],
)
def test_sigterm_then_resume_equals_an_uninterrupted_run(
    tmp_path, tiny_model_dir, straight_with_eval, target, stop_line
):
    config = write_config(tmp_path, tiny_model_dir, max_steps=2)
    evaluation = [x.format(data=tmp_path / "train.jsonl") for x in EVAL]
    driver = tmp_path / "driver.py"
    driver.write_text(SIGTERM_DRIVER)
    proc = subprocess.run(
        [sys.executable, str(driver), target, "1", str(config), *evaluation],
        env=cli_env(**THREADS),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 143 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert [line for line in proc.stderr.splitlines() if "SIGTERM" in line] == [stop_line]
    run = tmp_path / "run"
    for folder in list_checkpoints(run):
        verify_checkpoint(folder)
    train_in_process(config, "resume_from=latest", *evaluation)
    assert_same_run(run, straight_with_eval)


# ---- a full disk while saving -------------------------------------------------------------------------------------
def can_mount_tmpfs(folder: Path) -> bool:
    folder.mkdir(parents=True, exist_ok=True)
    probe = ["unshare", "--mount", "sh", "-c", f"mount -t tmpfs -o size=64k tmpfs '{folder}'"]
    try:
        return subprocess.run(probe, capture_output=True, timeout=30, check=False).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


@pytest.mark.slow  # 60 s measured on two shared cores; tests/unit/test_checkpoint_manifest.py has the quick case
def test_a_full_disk_while_saving_a_checkpoint_is_one_line_and_resume_after_freeing_space_is_exact(
    tmp_path, tiny_model_dir, finished
):
    """The run's checkpoints/ is a tmpfs (in a private mount namespace) with room for one checkpoint and a half:
    step 2's checkpoint fails on ENOSPC. Then the tmpfs grows (space freed) and `resume_from=latest` continues from
    step 1."""
    config = write_config(tmp_path, tiny_model_dir, max_steps=3)
    run, out = tmp_path / "run", tmp_path / "out"
    if not can_mount_tmpfs(run / "checkpoints"):
        pytest.skip("needs `unshare --mount` and `mount -t tmpfs` (root, or a user namespace) for a real full disk")
    size = sum(p.stat().st_size for p in list_checkpoints(finished[1])[0].iterdir())  # a checkpoint of this config
    out.mkdir()
    python = sys.executable
    script = f"""
        mount -t tmpfs -o size={size * 3 // 2} tmpfs '{run}/checkpoints' || exit 90
        '{python}' -m grpokit.cli train '{config}' > '{out}/first.out' 2> '{out}/first.err'
        echo $? > '{out}/first.code'
        cp -a '{run}/checkpoints' '{out}/after-full'
        mount -o remount,size={size * 10} '{run}/checkpoints' || exit 91
        '{python}' -m grpokit.cli train '{config}' resume_from=latest > '{out}/second.out' 2> '{out}/second.err'
        echo $? > '{out}/second.code'
        cp -a '{run}/checkpoints' '{out}/after-resume'
    """
    done = subprocess.run(["unshare", "--mount", "sh", "-c", script], env=cli_env(**THREADS), timeout=1200, check=False)
    assert done.returncode == 0
    first, second = (
        subprocess.CompletedProcess([], int((out / f"{n}.code").read_text()), "", (out / f"{n}.err").read_text())
        for n in ("first", "second")
    )
    assert one_line(first, 2) == (
        f"grpokit: error: cannot write checkpoint {run / 'checkpoints' / 'step-2'}: No space left on device (ENOSPC) "
        "while writing states.pt; checkpoint step-1 and the earlier steps are intact: fix that, then resume with "
        "resume_from=latest."
    )
    assert sorted(p.name for p in (out / "after-full").iterdir()) == ["step-1"]  # no partial folder left
    verify_checkpoint(out / "after-full" / "step-1")
    second = subprocess.CompletedProcess(
        [], int((out / "second.code").read_text()), "", (out / "second.err").read_text()
    )
    assert second.returncode == 0, second.stderr[-3000:]
    assert grpokit_lines(second.stderr) == []
    assert sorted(p.name for p in (out / "after-resume").iterdir()) == ["step-2", "step-3"]
    assert_same_run(run, finished[1])
