"""Property tests of config parsing: overrides and YAML round-trip exactly, and no input whatsoever
(any key, any value, any YAML text) raises anything but a ConfigError."""

from __future__ import annotations

import dataclasses
import warnings

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from grpokit.config import (
    CHOICES,
    FIELD_SECTION,
    PATH_FIELDS,
    REPORT_SINKS,
    SECTIONS,
    ConfigError,
    GRPOConfig,
    load_config,
    parse_overrides,
)
from grpokit.config.trl_keys import TRL_DEFAULTS
from grpokit.system.paths import expand_path

TEXT = st.text(st.characters(exclude_categories=("Cs",)), max_size=20)  # no lone surrogates: not writable as UTF-8
FINITE = dict(allow_nan=False, allow_infinity=False)

# A valid value for each of a range of fields (the divisibility of the batch is drawn jointly below).
VALID = {
    "beta": st.floats(0, 10, **FINITE),
    "epsilon": st.floats(1e-6, 1, **FINITE),
    "epsilon_high": st.none() | st.floats(1e-6, 1, **FINITE),
    "num_iterations": st.integers(1, 8),
    "mask_truncated_completions": st.booleans(),
    "ref_model_mixup_alpha": st.floats(0, 1, **FINITE),
    "max_kl": st.none() | st.floats(1e-9, 1e9, **FINITE),
    "max_completion_length": st.integers(1, 10**6),
    "temperature": st.floats(1e-3, 100, **FINITE),
    "top_p": st.floats(1e-3, 1, **FINITE),
    "top_k": st.integers(0, 10**6),
    "learning_rate": st.floats(0, 1, **FINITE),
    "max_steps": st.integers(1, 10**9),
    "seed": st.integers(0, 2**62),
    "warmup_ratio": st.floats(0, 0.99, **FINITE),
    "shuffle": st.booleans(),
    "max_prompt_length": st.none() | st.integers(1, 10**6),
    "output_dir": TEXT,
    "prompt_column": TEXT,
    "resume_from": st.none() | TEXT.filter(lambda t: t not in ("null", "~")),  # those two mean None on the command line
    "report_to": st.lists(st.sampled_from(REPORT_SINKS), max_size=4),
    "save_total_limit": st.none() | st.integers(1, 100),
    **{name: st.sampled_from(choices) for name, choices in CHOICES.items()},
}


@st.composite
def valid_values(draw) -> dict:
    names = draw(st.lists(st.sampled_from(sorted(VALID)), unique=True, max_size=len(VALID)))
    values = {name: draw(VALID[name]) for name in names}
    if values.get("engine") == "vllm":  # vLLM samples in the learner process (no Ray), at temperatures up to 2
        values["backend"] = "none"
        values["temperature"] = min(values.get("temperature", 1.0), 2.0)
    if values.get("engine") == "transformers":  # transformers' generate runs in the learner's processes (no Ray)
        values["backend"] = "none"
    if values.get("kl_controller") == "adaptive":  # it steers beta towards target_kl, so both must be > 0
        values["target_kl"] = draw(st.floats(1e-4, 10, **FINITE))
        values["beta"] = draw(st.floats(1e-4, 1, **FINITE))
    if values.get("strategy") == "fsdp":  # FSDP shards the optimizer state and the reference itself
        values["optimizer"], values["ref_model_dtype"] = "adamw_torch_fused", "auto"
    if "max_steps" in values and "num_iterations" in values:  # TRL's form counts optimizer steps: whole batches
        values["max_steps"] = min(values["max_steps"] * values["num_iterations"], 10**9 // 8 * values["num_iterations"])
    g = draw(st.integers(2, 16))
    values["num_generations"] = g
    values["per_device_train_batch_size"] = g * draw(st.integers(1, 4))
    values["num_generations_eval"] = n = draw(st.integers(1, 16))
    values["pass_at_k"] = draw(st.lists(st.integers(1, n), max_size=3))
    return values


def cli_text(value) -> str:
    """How a user writes a value on the command line."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(cli_text(v) for v in value) + "]"
    return str(value)


@st.composite
def override_args(draw, values: dict) -> list[str]:
    args = []
    for name, value in values.items():
        text = cli_text(value)
        section = FIELD_SECTION[name]
        forms = [f"{name}={text}", f"{section}.{name}={text}", f"--{name}={text}"]
        if not text.startswith("--") and "=" not in text:
            forms.append(None)  # --key value, two arguments
        form = draw(st.sampled_from(forms))
        args += [f"--{name}", text] if form is None else [form]
    return args


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_overrides_round_trip(data):
    values = data.draw(valid_values())
    args = data.draw(override_args(values))
    cfg = load_config(None, args)
    assert cfg == GRPOConfig.from_grpokit(**values)  # a command line is grpokit's form (steps: generation batches)
    for name, value in values.items():
        # ~ and $VAR expanded in paths
        expected = expand_path(value) if name in PATH_FIELDS and isinstance(value, str) else value
        assert getattr(cfg, name) == expected, name


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_yaml_round_trip(data, tmp_path):
    # TRL's form (keyword arguments): num_iterations > 1 converts max_steps once; the saved YAML reads back as it is
    cfg = GRPOConfig(rewards=data.draw(st.lists(TEXT, max_size=2)), **data.draw(valid_values()))
    path = tmp_path / "config.yaml"
    path.write_text(cfg.to_yaml(), encoding="utf-8")
    assert load_config(path) == cfg


def test_string_fields_keep_their_text_on_the_command_line():
    # YAML would read these as 7, True and None; the field is a string, so the text is kept (a path's ~ expanded)
    cfg = load_config(None, ["output_dir=007", "prompt_column=yes", "model_name_or_path=~/models/x"])
    assert (cfg.output_dir, cfg.prompt_column, cfg.model_name_or_path) == ("007", "yes", expand_path("~/models/x"))
    assert cfg.model_name_or_path != "~/models/x"
    assert load_config(None, ["resume_from=null"]).resume_from is None


ANY_VALUE = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
    max_leaves=6,
)
FIELDS = sorted(FIELD_SECTION)


def only_config_errors(build) -> None:
    try:
        build()
    except ConfigError as exc:
        assert str(exc)  # a message, never empty


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(FIELDS), ANY_VALUE)
def test_any_value_for_any_field_is_accepted_or_a_config_error(name, value):
    only_config_errors(lambda: GRPOConfig(**{name: value}))


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(sorted(TRL_DEFAULTS)), ANY_VALUE)
def test_any_value_for_any_trl_key_is_accepted_or_a_config_error(name, value):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a key grpokit does not act on is named in a warning: accepted
        only_config_errors(lambda: GRPOConfig(**{name: value}))


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(FIELDS), TEXT)
def test_any_command_line_text_is_accepted_or_a_config_error(name, text):
    only_config_errors(lambda: load_config(None, [f"{name}={text}"]))


@settings(max_examples=200, deadline=None)
@given(st.lists(TEXT, max_size=4))
def test_any_arguments_are_accepted_or_a_config_error(args):
    only_config_errors(lambda: load_config(None, args))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    text=st.one_of(
        TEXT,
        ANY_VALUE.map(yaml.safe_dump),
        st.dictionaries(st.sampled_from([*SECTIONS, *FIELDS, "rewards"]), ANY_VALUE, max_size=4).map(yaml.safe_dump),
    )
)
def test_any_yaml_file_is_accepted_or_a_config_error(text, tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text(text, encoding="utf-8")
    only_config_errors(lambda: load_config(path))


@pytest.mark.parametrize("section", list(SECTIONS))
def test_every_default_is_valid_and_survives_the_command_line(section):
    """Each field's default, written on the command line, gives back the default config."""
    cls = SECTIONS[section]
    args = []
    for f in dataclasses.fields(cls):
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        args.append(f"{section}.{f.name}={cli_text(default)}")
    assert load_config(None, args) == GRPOConfig()


def test_parse_overrides_types():
    assert parse_overrides(["beta=0", "learning_rate=1e-5", "shuffle=false", "pass_at_k=[1, 4]", "max_kl=null"]) == {
        "beta": 0,
        "learning_rate": 1e-5,
        "shuffle": False,
        "pass_at_k": [1, 4],
        "max_kl": None,
    }


@pytest.mark.parametrize("value", [float("inf"), float("nan"), 10**400])
def test_float_fields_must_be_finite(value):
    with pytest.raises(ConfigError, match="must be a finite number"):
        GRPOConfig(learning_rate=value)
