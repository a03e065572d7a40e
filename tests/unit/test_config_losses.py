"""The config's loss settings: loss_type from the loss registry, each loss's own checks and advice, TRL's loss keys
acted on (not named as unused), and algo.imports, which registers a user's loss before the check."""

from __future__ import annotations

import subprocess
import sys
import warnings

import pytest
from shared_helpers import loss_spec

from grpokit.algos.loss_registry import LOSSES
from grpokit.config import ConfigError, GRPOConfig

TRL_LOSS_TYPES = ("grpo", "dr_grpo", "dapo", "bnpo", "cispo", "sapo", "luspo", "vespo")  # TRL 1.16's list


def build(**settings) -> tuple[GRPOConfig, list[str]]:
    """The config and the warnings its construction gave."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cfg = GRPOConfig(**settings)
    return cfg, [str(w.message) for w in caught]


@pytest.mark.parametrize("loss_type", TRL_LOSS_TYPES)
def test_every_trl_loss_type_is_accepted(loss_type):
    level = "sequence" if loss_type == "luspo" else "token"
    cfg, said = build(loss_type=loss_type, importance_sampling_level=level, epsilon_high=5.0)
    assert cfg.loss_spec().loss_type == loss_type
    assert not [s for s in said if "loss_type" in s or "TRL settings" in s]


def test_trl_loss_keys_reach_the_loss_spec_and_are_not_named_unused():
    cfg, said = build(
        loss_type="sapo",
        sapo_temperature_pos=0.9,
        sapo_temperature_neg=1.3,
        vespo_k_pos=1.5,
        vespo_lambda_pos=2.5,
        vespo_k_neg=2.5,
        vespo_lambda_neg=1.5,
        delta=4.0,
        off_policy_mask_threshold=0.5,
        top_entropy_quantile=0.2,
        mask_truncated_completions=True,
        scale_rewards=False,  # TRL's older form of "none"
    )
    spec = cfg.loss_spec()
    assert (spec.params.sapo_temperature_pos, spec.params.sapo_temperature_neg) == (0.9, 1.3)  # sapo's own
    vespo = cfg.replace(loss_type="vespo").loss_spec().params  # each loss's parameters are its own
    assert (vespo.vespo_k_pos, vespo.vespo_lambda_pos, vespo.vespo_k_neg, vespo.vespo_lambda_neg) == (
        1.5,
        2.5,
        2.5,
        1.5,
    )
    assert spec.delta == 4.0 and spec.off_policy_mask_threshold == 0.5
    assert cfg.top_entropy_quantile == 0.2 and cfg.mask_truncated_completions and cfg.scale_rewards == "none"
    assert not [s for s in said if "TRL settings" in s], said


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"loss_type": "sapo", "sapo_temperature_neg": 0.0}, r"sapo_temperature_neg=0.0 must be > 0"),
        ({"loss_type": "vespo", "vespo_k_pos": -1.0}, r"vespo_k_pos=-1.0 must be >= 0"),
        ({"loss_type": "vespo", "vespo_lambda_neg": -0.5}, r"vespo_lambda_neg=-0.5 must be >= 0"),
        ({"top_entropy_quantile": 1.5}, r"top_entropy_quantile=1.5 must be in \[0, 1\]"),
        ({"delta": 0.9}, r"delta=0.9 must be > 1 or null"),
        ({"off_policy_mask_threshold": -0.1}, r"off_policy_mask_threshold=-0.1 must be >= 0 or null"),
        ({"loss_type": "sapoo"}, r"loss_type='sapoo' is not valid; choose one of grpo, .*vespo.*Did you mean 'sapo'"),
    ],
)
def test_loss_settings_that_cannot_run_are_refused(settings, message):
    with pytest.raises(ConfigError, match=message):
        GRPOConfig(**settings)


@pytest.mark.parametrize(
    ("settings", "advice"),
    [
        ({"loss_type": "luspo"}, "set importance_sampling_level: sequence"),
        ({"loss_type": "vespo", "importance_sampling_level": "sequence"}, "set importance_sampling_level: token"),
        ({"loss_type": "cispo"}, "here 0.2: below 1 every on-policy token is weighted 0.2"),
        ({"loss_type": "dapo", "importance_sampling_level": "sequence"}, "each sequence weighs by its length"),
    ],
)
def test_settings_that_run_but_are_likely_mistakes_get_advice(settings, advice):
    _, said = build(**settings)
    assert any(advice in s for s in said), said


def test_the_papers_setups_get_no_advice():
    for settings in (
        {"loss_type": "grpo", "importance_sampling_level": "sequence"},  # GSPO
        {"loss_type": "luspo", "importance_sampling_level": "sequence"},
        {"loss_type": "cispo", "epsilon_high": 5.0},
        {"loss_type": "vespo"},
        {"loss_type": "sapo"},
    ):
        assert build(**settings)[1] == [], settings


TOY_LOSS = """
from grpokit.algos import register_loss


@register_loss("toy_reinforce", aggregation="bnpo")
def toy_reinforce(terms, spec):
    return -terms.advantages * terms.logprobs, {}
"""


def test_imports_register_a_loss_before_the_check(tmp_path):
    path = tmp_path / "my_losses.py"
    path.write_text(TOY_LOSS)
    unknown = r"loss_type='toy_reinforce' is not valid.*\(or a loss registered by a module of algo\.imports\)"
    with pytest.raises(ConfigError, match=unknown):
        GRPOConfig(loss_type="toy_reinforce")
    try:
        cfg = GRPOConfig(loss_type="toy_reinforce", imports=[str(path)])
        assert cfg.loss_spec().loss_type == "toy_reinforce"
        assert cfg.replace(beta=0.0).loss_type == "toy_reinforce"  # imported once; validating again is fine
    finally:
        LOSSES.pop("toy_reinforce", None)


def test_imports_that_fail_name_the_module(tmp_path):
    with pytest.raises(ConfigError, match=r"imports: file 'nowhere/x\.py' does not exist"):
        GRPOConfig(imports=["nowhere/x.py"])
    with pytest.raises(ConfigError, match=r"imports: cannot import 'no_such_module_xyz': ModuleNotFoundError"):
        GRPOConfig(imports="no_such_module_xyz")  # one name is a list of one
    broken = tmp_path / "broken.py"
    broken.write_text("raise RuntimeError('half-written module')\n")
    with pytest.raises(ConfigError) as failed:  # the file, its line and the exception
        GRPOConfig(imports=[str(broken)])
    assert str(failed.value) == (
        f"imports: {broken.resolve()}:1 (raise RuntimeError('half-written module')) raised RuntimeError at import: "
        "half-written module"
    )


def test_the_config_and_the_loss_registry_import_no_torch():
    code = "import sys, grpokit.config; grpokit.config.GRPOConfig(loss_type='vespo'); assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_loss_spec_of_a_loss_without_the_config_is_checked_too():

    with pytest.raises(ValueError, match="unknown loss_type 'x'"):
        loss_spec(loss_type="x")
