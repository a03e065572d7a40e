"""The allocator settings change the whole process: the CLI (owning its process) makes them, the library does not."""

from __future__ import annotations

import ctypes
import os
import platform
import subprocess
import sys

import pytest
from test_train import write_config

from grpokit import GRPOTrainer
from grpokit.cli import main
from grpokit.config import load_config


@pytest.fixture()
def mallopt_calls(monkeypatch):
    """Calls of glibc's mallopt, however they are made through ctypes; recorded, not applied to this process."""
    made = []
    real = ctypes.CDLL

    class Spy:
        def __init__(self, lib):
            self._lib = lib

        def __getattr__(self, name):
            if name == "mallopt":
                return lambda *args: made.append(args) or 1
            return getattr(self._lib, name)

    monkeypatch.setattr(ctypes, "CDLL", lambda name, *a, **k: Spy(real(name, *a, **k)))
    return made


@pytest.mark.skipif(
    not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc", reason="mallopt: Linux with glibc only"
)
def test_the_cli_opts_in_and_the_trainer_does_not(mallopt_calls, tmp_path, tiny_model_dir, word_prompts):
    config = write_config(tmp_path, tiny_model_dir, word_prompts)
    GRPOTrainer(args=load_config(config, [f"output_dir={tmp_path / 'api'}"]))
    assert mallopt_calls == []  # a Python user's process is left as it was
    assert main(["train", str(config), "max_steps=1"]) == 0
    assert mallopt_calls == [(-4, 0), (-1, -1)]  # the CLI, on CPU: mmap off, never trim (malloc.h numbers)


def _huge_pages_line(command: list[str], **env: str) -> str:
    environ = {k: v for k, v in os.environ.items() if k != "THP_MEM_ALLOC_ENABLE"} | env
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, env=environ)
    assert result.returncode == 0, result.stderr
    return next(line for line in result.stdout.splitlines() if line.startswith("- huge pages: "))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PyTorch's huge pages: Linux only")
def test_the_cli_asks_for_huge_pages_unless_the_environment_says():
    """PyTorch reads THP_MEM_ALLOC_ENABLE once, when it starts: the command sets it before importing torch, so its
    own process has it (`grpokit env` probes the alignment of fresh tensors), a user's 0 wins, and a Python program
    that imports grpokit is left as it was."""
    cli = [sys.executable, "-m", "grpokit", "env"]
    assert _huge_pages_line(cli).startswith("- huge pages: asked for tensors >= 2 MB (THP_MEM_ALLOC_ENABLE=1;")
    assert "not asked" in _huge_pages_line(cli, THP_MEM_ALLOC_ENABLE="0")
    library = "from grpokit.commands.env_report import format_report, report; print(format_report(report()))"
    assert "not asked" in _huge_pages_line([sys.executable, "-c", library])
