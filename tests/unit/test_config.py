"""Config parsing: sections, bare keys, aliases, CLI overrides, and the generated reference."""

from pathlib import Path

import pytest
from shared_helpers import loss_spec

from grpokit.config import ConfigError, GRPOConfig, config_reference, load_config, parse_overrides


def test_bare_keys_sections_and_aliases_reach_the_same_field():
    cfg = GRPOConfig(group_size=4, algo={"kl_coef": 0.1}, learning_rate="1e-5", per_device_train_batch_size=8)
    assert (cfg.num_generations, cfg.beta, cfg.learning_rate) == (4, 0.1, 1e-5)
    assert cfg.algo.num_generations == 4


def test_overrides_forms(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("algo:\n  num_generations: 4\noptim:\n  per_device_train_batch_size: 16\n")
    cfg = load_config(path, ["--group_size=16", "optim.learning_rate=3e-4", "--max_steps", "7", "report_to=[jsonl]"])
    assert (cfg.num_generations, cfg.learning_rate, cfg.max_steps, cfg.report_to) == (16, 3e-4, 7, ["jsonl"])
    assert parse_overrides(["beta=0"]) == {"beta": 0}


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"num_generation": 4}, "unknown config key 'num_generation'. Did you mean 'num_generations'?"),
        ({"num_generations": 1}, "num_generations=1: GRPO needs at least 2"),
        ({"per_device_train_batch_size": 6}, "= 6 is not divisible by num_generations (8)"),
        ({"loss_type": "dapoo"}, "Did you mean 'dapo'?"),
        ({"learning_rate": "fast"}, "learning_rate='fast' has the wrong type: expected float"),
        ({"epsilon": 0}, "epsilon=0.0 must be > 0"),
        ({"algo": {"lr": 1}}, "unknown config key 'algo.lr'"),
        ({"pass_at_k": [16]}, "pass_at_k contains 16"),
    ],
)
def test_bad_values_give_one_clear_message(kwargs, message):
    with pytest.raises(ConfigError) as err:
        GRPOConfig(**kwargs)
    assert message in str(err.value)


def test_roundtrip_through_yaml(tmp_path):
    cfg = GRPOConfig(num_generations=4, per_device_train_batch_size=8, rewards=["accuracy"])
    path = tmp_path / "c.yaml"
    path.write_text(cfg.to_yaml())
    assert load_config(path) == cfg


def test_docs_config_reference_is_current():
    doc = (Path(__file__).resolve().parents[2] / "docs" / "config.md").read_text()
    assert config_reference() in doc, "docs/config.md is stale: run python scripts/gen_config_reference.py"


def test_typed_keys_are_current_and_cover_every_key():
    """GRPOConfig's keys, typed for editors (config/typed_keys.py), are generated from the sections."""
    from grpokit.config import FIELD_SECTION, SECTIONS
    from grpokit.config.reference import trl_typed_keys_source, typed_keys_source
    from grpokit.config.typed_keys import TypedKeys
    from grpokit.config.typed_trl_keys import TypedTrlKeys

    config = Path(__file__).resolve().parents[2] / "grpokit" / "config"
    for name, source in (("typed_keys.py", typed_keys_source()), ("typed_trl_keys.py", trl_typed_keys_source())):
        stale = f"config/{name} is stale: run python scripts/gen_config_reference.py"
        assert (config / name).read_text() == source, stale
        assert len(source.splitlines()) <= 300, f"config/{name} is over 300 lines"
    annotated = set(TypedKeys.__annotations__)
    assert set(FIELD_SECTION) <= annotated and set(SECTIONS) <= annotated
    trl_only = set(TypedTrlKeys.__annotations__)
    assert "use_vllm" in trl_only and annotated & trl_only == {"optim"}  # TRL's optimizer name, and our section:
    assert TypedKeys.__annotations__["optim"] == "OptimConfig"  # cfg.optim is the section, as type checkers see it
    assert issubclass(GRPOConfig, TypedKeys) and GRPOConfig().learning_rate == 1e-6  # annotations only: read through


def test_algorithm_options_are_the_lists_algos_implements():
    # one definition: config validates with the very tuples the algorithms check against
    from grpokit.algos import names
    from grpokit.algos.loss_registry import loss_types
    from grpokit.config import CHOICES, FIELD_SECTION, SECTIONS, field_docs

    assert "loss_type" not in CHOICES  # the loss registry's names, checked after algo.imports (test_config_losses)
    assert all(name in field_docs(SECTIONS["algo"])["loss_type"] for name in loss_types())
    assert CHOICES["scale_rewards"] is names.SCALE_REWARDS
    # advantage estimators and engines are registries (algos/estimators.py, rollout/engines.py), not choice lists
    assert "advantage_estimator" not in CHOICES and "engine" not in CHOICES
    from grpokit.algos.estimators import ESTIMATORS

    assert all(name in field_docs(SECTIONS["algo"])["advantage_estimator"] for name in ESTIMATORS)
    with pytest.raises(ConfigError, match="unknown advantage_estimator 'rlo'; valid choices: grpo, rloo, reinforce_pp"):
        GRPOConfig(advantage_estimator="rlo")
    assert CHOICES["importance_sampling_level"] is names.IMPORTANCE_SAMPLING_LEVELS
    with pytest.raises(ConfigError, match="choose one of grpo, bnpo, dr_grpo, dapo"):
        GRPOConfig(loss_type="ppo")
    for name, choices in CHOICES.items():  # the field's help line names every option
        doc = field_docs(SECTIONS[FIELD_SECTION[name]])[name]
        assert all(choice in doc for choice in choices), (name, doc)


def test_loss_spec_carries_the_loss_settings():
    cfg = GRPOConfig(
        loss_type="dr_grpo",
        epsilon=0.1,
        epsilon_high=0.3,
        beta=0.02,
        use_bias_correction_kl=True,
        importance_sampling_level="sequence",
        max_completion_length=17,
        vllm_importance_sampling_cap=2.5,
    )
    assert cfg.loss_spec() == loss_spec(
        loss_type="dr_grpo",
        epsilon=0.1,
        epsilon_high=0.3,
        beta=0.02,
        use_bias_correction_kl=True,
        importance_sampling_level="sequence",
        max_completion_length=17,
        sampling_cap=2.5,
    )
    assert GRPOConfig(epsilon=0.1).loss_spec().upper_epsilon == 0.1  # epsilon_high defaults to epsilon


def test_is_given_tells_a_set_key_from_a_default(tmp_path):
    # TRL's rules that depend on a key being set (max_steps with environment-owned data) read it
    config = GRPOConfig(learning_rate=1e-5, group_size=4)
    assert config.is_given("learning_rate") and config.is_given("num_generations") and config.is_given("group_size")
    assert not config.is_given("max_steps") and config.max_steps == -1  # the default (TRL's: epochs), not given
    assert config.replace(max_steps=7).is_given("max_steps") and config.replace(max_steps=7).is_given("learning_rate")
    config.max_steps = 3
    assert config.is_given("max_steps")
    path = tmp_path / "c.yaml"
    path.write_text("optim:\n  max_steps: 5\n")
    assert load_config(path).is_given("max_steps") and not load_config(path).is_given("beta")
    assert load_config(path, ["beta=0.1"]).is_given("beta")
