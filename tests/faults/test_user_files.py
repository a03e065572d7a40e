"""Every user file that fails to import, whatever names it (a reward, a tool, an environment factory, a tool parser,
algo.imports; a file path or an installed module): `grpokit train` exits 2 with one line naming the file, the line
and the exception, before any model loads. docs/reliability.md lists these promises."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from shared_helpers import TARGET_REWARD, tiny_run_config

from .conftest import cli_env, one_line

# Each user file: (its text, the 1-based line that fails, the exception named).
FILES = {
    "reward_name_error.py": ("import math\n\nSCALE = math.tau * UNDEFINED\n", 3, "NameError"),
    "reward_syntax.py": ("def reward(completions, **kw):\n    return [1.0 for c in completions\n", 2, "SyntaxError"),
    "tool_missing_module.py": ("import json\nimport no_such_module_for_grpokit\n", 2, "ModuleNotFoundError"),
    "env_exits.py": ("import sys\n\nsys.exit('configure me first')\n", 3, "SystemExit"),
    "parser_raises.py": ("PATTERNS = {}\nPATTERNS['call'].compile()\n", 2, "KeyError"),
    "loss_module.py": ("import grpokit.algos\n\nBASE = grpokit.algos.no_such_loss_helper\n", 3, "AttributeError"),
}
TOOL = '''def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: The first factor.
        b: The second factor.
    """
    return a * b
'''


def write_config(
    folder: Path, model_dir: Path, rewards: list, agent: dict | None = None, algo: dict | None = None
) -> Path:
    prompts = [{"prompt": [{"role": "user", "content": "w1 w2"}], "target": "w7"}] * 4
    path = tiny_run_config(
        folder,
        model_dir,
        max_steps=1,
        num_generations=2,
        rewards=rewards,
        prompts=prompts,
        algo=algo or {},
        agent=agent or {},
    )
    return path.rename(folder / "config.yaml")


@pytest.mark.parametrize(
    "setting, name",
    [
        ("rewards", "reward_name_error.py"),
        ("rewards", "reward_syntax.py"),
        ("tools", "tool_missing_module.py"),
        ("environment_factory", "env_exits.py"),
        ("tool_parser", "parser_raises.py"),
        ("imports", "loss_module.py"),  # algo.imports: modules that register losses
    ],
)
def test_a_user_file_that_fails_to_import(tmp_path, tiny_model_dir, setting, name):
    text, line, exception = FILES[name]
    user_file = tmp_path / name
    user_file.write_text(text)
    (tmp_path / "tool.py").write_text(TOOL)
    spec = f"{user_file}:thing"
    rewards, agent, algo = [TARGET_REWARD], {}, {}
    if setting == "imports":
        algo = {"imports": [str(user_file)]}
    elif setting == "rewards":
        rewards = [spec]
    elif setting == "tool_parser":  # read only for a run with tools
        agent = {"tools": [f"{tmp_path / 'tool.py'}:multiply"], "tool_parser": spec}
    else:
        agent = {setting: [spec] if setting == "tools" else spec}
    config = write_config(tmp_path, tiny_model_dir, rewards, agent, algo)
    proc = subprocess.run(
        [sys.executable, "-m", "grpokit", "train", str(config)],
        cwd=tmp_path,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    message = one_line(proc, 2)
    code = text.splitlines()[line - 1].strip()
    prefix = {"rewards": "rewards", "imports": "imports"}.get(setting, "agent")
    assert message.startswith(f"grpokit: error: {prefix}: {user_file}:{line} ({code}) raised {exception} at import"), (
        message
    )
    assert not (tmp_path / "run").exists()


def test_an_installed_module_that_fails_to_import(tmp_path, tiny_model_dir):
    """`module:function` of a module on the path that raises: its file and line, not "cannot import module"."""
    package = tmp_path / "site" / "myrewards"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "scoring.py").write_text("import os\n\nTHRESHOLD = int(os.environ['NO_SUCH_VARIABLE_FOR_GRPOKIT'])\n")
    config = write_config(tmp_path, tiny_model_dir, ["myrewards.scoring:score"])
    env = cli_env()
    env["PYTHONPATH"] = f"{tmp_path / 'site'}:{env.get('PYTHONPATH', '')}"
    proc = subprocess.run(
        [sys.executable, "-m", "grpokit", "train", str(config)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert one_line(proc, 2) == (
        f"grpokit: error: rewards: reward 'myrewards.scoring:score': {package / 'scoring.py'}:3 "
        "(THRESHOLD = int(os.environ['NO_SUCH_VARIABLE_FOR_GRPOKIT'])) raised KeyError at import: "
        "'NO_SUCH_VARIABLE_FOR_GRPOKIT'"
    )
