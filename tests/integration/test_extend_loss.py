"""Adding a built-in loss with one parameter touches the files docs/architecture.md names, and no others: in a copy
of the package, a new module of grpokit/algos/ (the loss under ``@register_loss``), its name in
``loss_registry.BUILT_IN``, its parameters' dataclass in loss_params.py and among AlgoConfig's bases (so its field
is an ``algo`` key), and typed_keys.py regenerated. Then ``grpokit train`` on the copy trains a step with it, the
parameter from the YAML reaching the loss, and the loss's check refuses a bad one from ``key=value``."""

from __future__ import annotations

import pytest
from package_copy import assert_changes_are_the_pages
from shared_helpers import logged_steps, tiny_run_config

LOSS = "algos/scaled_pg.py"
LOSS_MODULE = '''"""scaled_pg: REINFORCE whose policy gradient is scaled by ``pg_scale`` (a test's built-in loss)."""

from __future__ import annotations

from grpokit.algos.loss_params import ScaledPgParams
from grpokit.algos.loss_registry import LossSettings, register_loss


def _check(settings: LossSettings) -> list[str]:
    if not settings.params.pg_scale > 0:
        raise ValueError(f"pg_scale={settings.params.pg_scale} must be > 0 (the policy gradient's factor).")
    return []


@register_loss("scaled_pg", aggregation="bnpo", check=_check, params=ScaledPgParams)
def scaled_pg_loss(terms, spec):
    """Per token: -pg_scale * A * log pi; its metric shows the run's pg_scale reached the loss."""
    return -spec.params.pg_scale * terms.advantages * terms.logprobs, {"scaled_pg/scale": spec.params.pg_scale}
'''
PARAMS = '''

@dataclass
class ScaledPgParams:
    """scaled_pg's own parameter."""

    pg_scale: float = 1.0
    """scaled_pg: the factor of the policy gradient."""
'''
EXPECTED = {LOSS, "algos/loss_registry.py", "algos/loss_params.py", "config/training.py", "config/typed_keys.py"}


@pytest.fixture(scope="module")
def extended(package_copy):
    package_copy.add(LOSS, LOSS_MODULE)
    package_copy.edit("algos/loss_registry.py", ('"luspo", "vespo")', '"luspo", "vespo", "scaled_pg")'))
    last = '    """vespo: decay lambda of the kernel, for A < 0."""\n'
    package_copy.edit("algos/loss_params.py", (last, last + PARAMS))
    package_copy.edit(
        "config/training.py",
        ("import SapoParams, VespoParams", "import SapoParams, ScaledPgParams, VespoParams"),
        ("    VespoParams,\n", "    VespoParams,\n    ScaledPgParams,\n"),
    )
    package_copy.regenerate_typed_keys()
    return package_copy


def test_a_loss_touches_the_files_the_page_names(extended):
    assert_changes_are_the_pages(extended, "A loss", EXPECTED)


@pytest.mark.usefixtures("one_thread")
def test_the_loss_trains_a_step_from_the_command_line(extended, tmp_path, tiny_model_dir):
    config = tiny_run_config(tmp_path, tiny_model_dir, max_steps=1, algo={"loss_type": "scaled_pg", "pg_scale": 0.5})
    codes, stderr = extended.cli_runs(["train", config, "pg_scale=0"], ["train", config])
    assert codes == [2, 0], stderr[-3000:]
    assert "grpokit: error: pg_scale=0.0 must be > 0 (the policy gradient's factor)." in stderr.splitlines()
    (step,) = logged_steps(tmp_path / "run")
    assert step["scaled_pg/scale"] == 0.5  # the YAML's pg_scale reached the loss
