"""keep_freed_memory changes the process's allocator: the CLI (owning its process) calls it, the library does not."""

from __future__ import annotations

import ctypes
import platform
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
    assert mallopt_calls == [(-4, 0), (-1, 2**30)]  # the CLI, on CPU: mmap off, no trimming (malloc.h numbers)
