"""Adding a command touches the files docs/architecture.md names, and no others in the package: in a copy of it, a
new module of grpokit/commands/ with ``register(subparsers)`` (its heavy import inside the function) and its name in
``COMMANDS`` (grpokit/cli.py). Then ``python -m grpokit losses`` on the copy runs it, and ``--help`` lists it. (The
page also asks for its usage on a page of docs/, outside the package, which tests/integration/test_docs_commands.py
runs.)"""

from __future__ import annotations

import pytest
from package_copy import assert_changes_are_the_pages

from grpokit.algos.loss_registry import loss_types

COMMAND = "commands/losses.py"
COMMAND_MODULE = '''"""`grpokit losses`: the loss types a config may name, one a line (a test's command)."""

from __future__ import annotations


def register(sub) -> None:
    p = sub.add_parser("losses", help="list the loss types a config's loss_type may name")
    p.set_defaults(func=run_losses)


def run_losses(args) -> int:
    from grpokit.algos.loss_registry import loss_types

    print("\\n".join(loss_types()))
    return 0
'''
EXPECTED = {COMMAND, "cli.py"}


@pytest.fixture(scope="module")
def extended(package_copy):
    package_copy.add(COMMAND, COMMAND_MODULE)
    package_copy.edit("cli.py", ('    "doctor",\n)', '    "doctor",\n    "losses",\n)'))
    return package_copy


def test_a_command_touches_the_files_the_page_names(extended):
    assert_changes_are_the_pages(extended, "A command", EXPECTED)


def test_the_command_runs(extended):
    out = extended.python("-m", "grpokit", "losses")
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == list(loss_types())  # clipped, cispo, sapo, luspo, vespo: the built-ins
    helped = extended.python("-m", "grpokit", "--help")
    assert helped.returncode == 0 and ",doctor,losses}" in helped.stdout  # the last of the choices
