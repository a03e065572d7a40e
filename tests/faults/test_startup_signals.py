"""SIGINT and SIGTERM from the first line of the CLI to its last: exit 130 / 143 and one line, never a traceback.

Each case aims its signal with the fault hooks' import hook (GRPOKIT_FAULT_SIGNAL_AT: the signal arrives inside the
import of that module, and of everything importing it), at one of the CLI's three entry points: `python -m
grpokit`, the installed console script and `python -m grpokit.cli`. The imports are those the outside campaign hit:
numpy's C extension initialising (it gave two tracebacks ending in "cannot load module more than once per
process"), transformers' modeling utilities, where AttentionInterface lives ("Could not import module
'AttentionInterface'"), torch (a Ctrl-C in the first second), and the first import inside `main`. The interpreter's
teardown after a finished command is the last line. (Signals during training: tests/integration/test_signals.py.)
docs/reliability.md lists these promises."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from shared_helpers import tiny_run_config

from .conftest import hooked_env

# What pip writes as the `grpokit` console script, for an environment where it is not installed.
CONSOLE_SCRIPT = "import sys\nfrom grpokit.cli import main\nsys.exit(main())\n"


def entry_point(name: str) -> list[str]:
    if name == "python -m grpokit":
        return [sys.executable, "-m", "grpokit"]
    if name == "python -m grpokit.cli":
        return [sys.executable, "-m", "grpokit.cli"]
    script = Path(sys.executable).with_name("grpokit")  # the console script of this environment
    return [str(script)] if script.is_file() else [sys.executable, "-c", CONSOLE_SCRIPT]


@pytest.fixture()
def config(tmp_path, tiny_model_dir) -> Path:
    """A training config on the tiny model (its run never gets far: the signal comes while importing)."""
    prompts = [{"prompt": "w1 w2 w3", "target": "w7"}] * 4
    return tiny_run_config(tmp_path, tiny_model_dir, max_steps=1, num_generations=2, prompts=prompts)


def assert_stopped(proc: subprocess.CompletedProcess, signame: str) -> None:
    """Exit 128 + the signal and the one line, alone on stderr (nothing else: no traceback, no library error)."""
    code = {"SIGINT": 130, "SIGTERM": 143}[signame]
    assert proc.returncode == code, proc.stderr[-3000:]
    assert [line for line in proc.stderr.splitlines() if line.strip()] == [f"grpokit: stopped by {signame}"], (
        proc.stderr[-3000:]
    )


@pytest.mark.parametrize(
    "entry, module, signame",
    [
        ("python -m grpokit", "grpokit.cli", "SIGTERM"),  # __main__'s first line, before the CLI is imported
        ("python -m grpokit", "argparse", "SIGINT"),  # main's first import
        ("console script", "argparse", "SIGTERM"),
        ("python -m grpokit.cli", "argparse", "SIGINT"),
        ("python -m grpokit", "numpy._core._exceptions", "SIGTERM"),  # inside numpy's C extension's init
        ("console script", "numpy._core._exceptions", "SIGINT"),
        ("python -m grpokit", "transformers.modeling_utils", "SIGINT"),  # AttentionInterface's module
        ("console script", "torch", "SIGINT"),
        ("python -m grpokit.cli", "torch", "SIGTERM"),
    ],
)
def test_a_signal_while_the_cli_imports(config, entry, module, signame):
    proc = subprocess.run(
        [*entry_point(entry), "train", str(config)],
        cwd=config.parent,  # not the repository: `python -m` runs the grpokit on PYTHONPATH
        env=hooked_env(GRPOKIT_FAULT_SIGNAL_AT=f"{module}:{signame}"),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert_stopped(proc, signame)
    assert not (config.parent / "run").exists()  # nothing was written


def test_a_second_signal_during_an_import_stops_at_once(config):
    """The first signal waits for the import to end; a second one meanwhile ends the process at once, with the
    line of the second (an import that never ended could not hold the process)."""
    proc = subprocess.run(
        [*entry_point("python -m grpokit"), "train", str(config)],
        cwd=config.parent,
        env=hooked_env(GRPOKIT_FAULT_SIGNAL_AT="torch:SIGINT,SIGTERM"),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert_stopped(proc, "SIGTERM")


@pytest.mark.parametrize("entry, signame", [("python -m grpokit", "SIGINT"), ("console script", "SIGTERM")])
def test_a_signal_in_the_interpreters_teardown(config, entry, signame):
    """The command finished and printed its result; a signal while the interpreter shuts down is still the one line
    and 128 + signum (the handlers stay until the process ends), and the output is whole."""
    proc = subprocess.run(
        [*entry_point(entry), "explain", str(config)],
        cwd=config.parent,
        env=hooked_env(GRPOKIT_FAULT_SIGNAL_AT_EXIT=signame),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert_stopped(proc, signame)
    assert "num_generations" in proc.stdout  # explain's report was printed before the signal
