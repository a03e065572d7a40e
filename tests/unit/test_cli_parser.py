"""The command line's own surface: `grpokit --version`, help on every argument, transformers' bars off."""

from __future__ import annotations

import contextlib
import io
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import grpokit
from grpokit.cli import main

ROOT = Path(__file__).parents[2]
COMMANDS = ("train", "eval", "explain", "demo", "env", "inspect", "report")


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "grpokit", *args], capture_output=True, text=True, timeout=120)


def test_version_prints_the_package_version():
    result = run_cli("--version")
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"grpokit {grpokit.__version__}\n"
    # the version a user sees is the one pip installed: pyproject.toml's
    declared = re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M).group(1)
    assert grpokit.__version__ == declared


def help_text(*args: str) -> str:
    """What ``grpokit ARGS --help`` prints, at a fixed width (argparse wraps to $COLUMNS)."""
    out = io.StringIO()
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(out), pytest.raises(SystemExit) as stop:
        mp.setenv("COLUMNS", "200")
        main([*args, "--help"])
    assert stop.value.code == 0
    return out.getvalue()


def listed(text: str, section: str) -> dict[str, str]:
    """The entries of a help section ("positional arguments:", "options:"): name -> its help ('' when none)."""
    body = text.split(f"\n{section}\n", 1)[1].split("\n\n", 1)[0]
    entries: dict[str, str] = {}
    name = None
    for line in body.splitlines():
        if re.match(r"^  \S", line):  # an argument: its name, then its help after two spaces
            name, _, description = line.strip().partition("  ")
            entries[name] = description.strip()
        elif name is not None:  # more help, or all of it when the name is too long to share its line
            entries[name] = f"{entries[name]} {line.strip()}".strip()
    return entries


def test_every_argument_of_every_command_has_help():
    assert set(COMMANDS) <= set(re.findall(r"^    (\w+)\s", help_text(), re.M))  # every command is listed
    missing = []
    for command in COMMANDS:
        text = help_text(command)
        for section in ("positional arguments:", "options:"):
            if f"\n{section}\n" in text:
                missing += [f"grpokit {command} {name}" for name, desc in listed(text, section).items() if not desc]
    assert not missing, f"arguments without help: {missing}"


def test_the_listing_reads_help_as_argparse_prints_it():
    """The parser of the help text finds an argument without help (else the test above could not fail)."""
    text = (
        "usage: x\n\npositional arguments:\n  config\n  overrides   key=value settings\n\n"
        "options:\n  -h, --help  show\n  --output-dir OUTPUT_DIR\n              the run folder\n  --steps STEPS\n"
    )
    assert listed(text, "positional arguments:") == {"config": "", "overrides": "key=value settings"}
    assert listed(text, "options:") == {
        "-h, --help": "show",
        "--output-dir OUTPUT_DIR": "the run folder",
        "--steps STEPS": "",
    }


def test_help_shows_the_positionals_help():
    text = help_text("train")
    assert re.search(r"^  config\s+a YAML config \(every key: docs/config.md\)$", text, re.M), text
    assert re.search(r"^  overrides\s+key=value settings that replace the config's$", text, re.M), text


QUIET = """
from grpokit.commands.running import quiet_model_loading
from huggingface_hub.utils import are_progress_bars_disabled
from transformers.utils import logging
before = logging.is_progress_bar_enabled(), are_progress_bars_disabled()
quiet_model_loading()
print(before, (logging.is_progress_bar_enabled(), are_progress_bars_disabled()))
"""


def quiet_state(**env: str) -> str:
    environment = {k: v for k, v in os.environ.items() if k != "HF_HUB_DISABLE_PROGRESS_BARS"}
    result = subprocess.run(
        [sys.executable, "-c", QUIET], capture_output=True, text=True, timeout=120, env={**environment, **env}
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_transformers_bars_go_and_download_bars_stay():
    # (transformers' bars on, hub's bars disabled?) before -> after
    assert quiet_state() == "(True, False) (False, False)"
    # the user's HF_HUB_DISABLE_PROGRESS_BARS wins either way
    assert quiet_state(HF_HUB_DISABLE_PROGRESS_BARS="0") == "(True, False) (True, False)"
    assert quiet_state(HF_HUB_DISABLE_PROGRESS_BARS="1") == "(False, True) (False, True)"
