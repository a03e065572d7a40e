"""Helpers of the fault tests: a run config on the tiny model, `grpokit` in a subprocess, the check that a failure
is one line without a traceback, a snapshot of a run folder's files, a finished run to break, the fault hooks
(tests/faults/hooks/sitecustomize.py) on the path, and storage that is full or read-only: a real tmpfs or read-only
bind mount where this machine allows one, else the hooks' simulation."""

from __future__ import annotations

import contextlib
import hashlib
import os
import subprocess
import tempfile
from pathlib import Path

import pytest
from shared_helpers import cli_env, tiny_run_config, word_prompts
from shared_helpers import grpokit_cli as grpokit

HOOKS = Path(__file__).with_name("hooks")

REWARDS = Path(__file__).with_name("rewards_for_faults.py")
GATED, WRONG_LENGTH = f"{REWARDS}:gated", f"{REWARDS}:wrong_length"
G, PROMPTS_PER_STEP = 4, 2
EVAL = ["eval_dataset={data}", "eval_steps=1", "max_eval_prompts=2", "num_generations_eval=2", "pass_at_k=[1]"]


def write_config(tmp_path: Path, model_dir: Path, max_steps: int = 2, **run) -> Path:
    """tmp_path/config.yaml: the tiny run (shared_helpers.tiny_run_config) with the `gated` reward, a checkpoint every
    step, constant learning rate (a resume with a larger max_steps trains as a longer run would)."""
    path = tiny_run_config(
        tmp_path,
        model_dir,
        max_steps=max_steps,
        num_generations=G,
        prompts_per_step=PROMPTS_PER_STEP,
        rewards=[GATED],
        optim={"lr_scheduler_type": "constant"},
        run={"save_steps": 1, "save_total_limit": 2, **run},
        reward={"reward_timeout": 600},  # the gate holds the first call while a test acts
    )
    return path.rename(tmp_path / "config.yaml")


def grpokit_lines(stderr: str) -> list[str]:
    """grpokit's own lines on stderr (other libraries' progress bars and warnings left out)."""
    return [line for line in stderr.splitlines() if line.startswith("grpokit:")]


def one_line(proc: subprocess.CompletedProcess, code: int) -> str:
    """Exit ``code``, no traceback, exactly one line from grpokit on stderr; returns that line."""
    assert proc.returncode == code, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    lines = grpokit_lines(proc.stderr)
    assert len(lines) == 1, proc.stderr[-3000:]
    return lines[0]


def snapshot(run: Path) -> dict[str, str]:
    """Every file of a run folder (relative path -> SHA-256), the lock file left out (it names the last writer)."""
    return {
        p.relative_to(run).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(run.rglob("*"))
        if p.is_file() and p.name != ".grpokit.lock"
    }


# ---- edges: a finished run, the fault hooks, full and read-only storage

# What a reader of the store may add to a run folder: SQLite's shared-memory index and (empty) log of a WAL database.
READER_FILES = ("rollouts.sqlite-shm", "rollouts.sqlite-wal")


def kept(run: Path, before: dict[str, str]) -> bool:
    """Every file of ``before`` (a :func:`snapshot`) is in ``run`` unchanged, and nothing was added besides
    :data:`READER_FILES` (where the storage let SQLite create them)."""
    after = snapshot(run)
    added = set(after) - set(before)
    return all(after.get(name) == digest for name, digest in before.items()) and added <= set(READER_FILES)


def hooked_env(**faults: str) -> dict:
    """cli_env with the fault hooks first on PYTHONPATH and ``faults`` (GRPOKIT_FAULT_* variables) set."""
    path = os.pathsep.join(p for p in (str(HOOKS), os.environ.get("PYTHONPATH", "")) if p)
    return cli_env(PYTHONPATH=path, **faults)


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory, tiny_model_dir) -> Path:
    """A finished two-step run of the tiny model (store, metrics, report, checkpoint, final model), with an eval
    set so `grpokit eval RUN` has something to do. Module-wide: tests copy it before changing anything."""
    root = tmp_path_factory.mktemp("finished")
    path = tiny_run_config(
        root,
        tiny_model_dir,
        max_steps=2,
        num_generations=2,
        prompts=word_prompts(8, 4),
        data={"eval_dataset": str(root / "train.jsonl")},
        eval={"eval_strategy": "no", "max_eval_prompts": 2, "num_generations_eval": 2, "pass_at_k": [1]},
        run={"save_steps": 1},
    )
    proc = grpokit("train", path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return root / "run"


def can_mount() -> bool:
    """Whether this process may mount (a tmpfs, a read-only bind): root with the capability, as in a container
    started with it. Tried on a scratch folder. GRPOKIT_FAULTS_SIMULATE=1 says no, to run the simulations."""
    if os.environ.get("GRPOKIT_FAULTS_SIMULATE"):
        return False
    with tempfile.TemporaryDirectory() as scratch:
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", scratch], capture_output=True)
        if done.returncode != 0:
            return False
        subprocess.run(["umount", scratch], check=True)
        return True


@contextlib.contextmanager
def mounted(*mount_args: str, target: Path):
    """``mount MOUNT_ARGS TARGET`` for the block, unmounted after it however it ends."""
    subprocess.run(["mount", *mount_args, str(target)], check=True, capture_output=True)
    try:
        yield target
    finally:
        subprocess.run(["umount", "-l", str(target)], check=False)


@contextlib.contextmanager
def read_only(folder: Path):
    """``folder`` on read-only storage for the block: a read-only bind mount of itself where mounting is allowed,
    else (root, for whom permissions do not stop writes) the hooks' simulated EROFS; yields the environment the CLI
    runs in."""
    if can_mount():
        with mounted("--bind", "-o", "ro", str(folder), target=folder):
            probe = folder / ".probe"
            with pytest.raises(OSError):
                probe.write_text("x")  # the bind really is read-only
            yield cli_env()
    else:
        yield hooked_env(GRPOKIT_FAULT_WRITE_ERROR=f"EROFS:{folder}")


@contextlib.contextmanager
def full_disk(folder: Path, holding: Path | None = None):
    """``folder`` on a full disk for the block, with a copy of the run folder ``holding`` (if given) in it under
    the same name: a small tmpfs filled to the last byte where mounting is allowed, else the hooks' simulated
    ENOSPC; yields the environment the CLI runs in."""
    folder.mkdir(parents=True, exist_ok=True)
    copy = ["cp", "-a", str(holding), str(folder)] if holding is not None else None
    if not can_mount():
        if copy:
            subprocess.run(copy, check=True)
        yield hooked_env(GRPOKIT_FAULT_WRITE_ERROR=f"ENOSPC:{folder}")
        return
    with mounted("-t", "tmpfs", "-o", "size=16m", "tmpfs", target=folder):
        if copy:
            subprocess.run(copy, check=True)
        subprocess.run(["dd", "if=/dev/zero", f"of={folder / '.filler'}", "bs=4k"], capture_output=True, check=False)
        probe = folder / ".probe"
        with pytest.raises(OSError):  # the disk really is full
            probe.write_bytes(b"x" * 4096)
        probe.unlink(missing_ok=True)
        yield cli_env()
