"""generation.engine: auto (grpokit/rollout/engine_choice.py): the resolver with the measurement stubbed, its
cache, and the config accepting auto while a typo is still refused."""

from __future__ import annotations

import json

import pytest

from grpokit.compose.rollouts import engine_kind
from grpokit.config import ConfigError, GRPOConfig
from grpokit.rollout import engine_choice
from grpokit.rollout.engine_choice import choose, resolve

SHAPE = {"shapes": [[64, 128, 4]], "dtypes": ["None", "None", "torch.float32"], "rows": 8, "tokens": 16}


class Measure:
    """A stubbed measurement: the given rates, and how many times it ran."""

    def __init__(self, **rates):
        self.rates, self.calls = rates, []

    def __call__(self, names):
        self.calls.append(list(names))
        return {name: self.rates[name] for name in names}


@pytest.fixture
def vllm_installed(monkeypatch):
    monkeypatch.delenv(engine_choice.FORCE_ENV, raising=False)
    monkeypatch.setattr(engine_choice, "installed", lambda package: package == "vllm")
    monkeypatch.setattr(engine_choice, "package_version", lambda package: "0.0-test")


def test_vllm_missing_is_hf_unmeasured(monkeypatch, tmp_path):
    monkeypatch.delenv(engine_choice.FORCE_ENV, raising=False)
    monkeypatch.setattr(engine_choice, "installed", lambda package: False)
    measure = Measure(hf=1.0, vllm=100.0)
    choice = resolve("cpu", measure, shape=SHAPE, root=tmp_path)
    assert (choice.name, choice.reason) == ("hf", "vllm not installed")
    assert measure.calls == [] and not list(tmp_path.rglob("*.json"))


def test_faster_vllm_is_chosen_and_cached(vllm_installed, tmp_path):
    measure = Measure(hf=100.0, vllm=117.0)  # 117 > 1.05 x 100 = 105
    choice = resolve("cpu", measure, shape=SHAPE, root=tmp_path)
    assert choice.name == "vllm" and choice.rates == {"hf": 100.0, "vllm": 117.0}
    assert "saved in" in choice.source and measure.calls == [["hf", "vllm"]]
    again = resolve("cpu", measure, shape=SHAPE, root=tmp_path)  # the cache answers: no second measurement
    assert again.name == "vllm" and "cached in" in again.source and len(measure.calls) == 1
    other = resolve("cpu", measure, shape={**SHAPE, "rows": 4}, root=tmp_path)  # another shape: measured
    assert other.name == "vllm" and len(measure.calls) == 2


@pytest.mark.parametrize("vllm_rate", [50.0, 104.0])  # slower; within the 5 % tie (104 <= 105)
def test_slower_or_tied_vllm_is_hf(vllm_installed, tmp_path, vllm_rate):
    choice = resolve("cpu", Measure(hf=100.0, vllm=vllm_rate), shape=SHAPE, root=tmp_path)
    assert choice.name == "hf" and "not > 1.05 x hf 100" in choice.reason


def test_corrupt_cache_is_ignored_and_measured_again(vllm_installed, tmp_path, capsys):
    measure = Measure(hf=100.0, vllm=200.0)
    first = resolve("cpu", measure, shape=SHAPE, root=tmp_path)
    (path,) = tmp_path.rglob("*.json")
    path.write_text("{not json")
    second = resolve("cpu", measure, shape=SHAPE, root=tmp_path)
    assert first.name == second.name == "vllm" and len(measure.calls) == 2
    assert f"ignoring {path}" in capsys.readouterr().err
    entry = json.loads(path.read_text())  # replaced by the new measurement
    assert entry["rates"] == {"hf": 100.0, "vllm": 200.0}
    entry["rates"]["vllm"] = -1  # readable but not a rate: measured again too
    path.write_text(json.dumps(entry))
    resolve("cpu", measure, shape=SHAPE, root=tmp_path)
    assert len(measure.calls) == 3


def test_cuda_picks_installed_vllm_unmeasured_and_refusals_keep_hf(vllm_installed, tmp_path):
    measure = Measure(hf=100.0, vllm=1.0)
    assert resolve("cuda", measure, shape=SHAPE, root=tmp_path).name == "vllm" and measure.calls == []
    refused = resolve("cpu", measure, shape=SHAPE, root=tmp_path, refusal=lambda name: "tools need hf")
    assert (refused.name, refused.reason) == ("hf", "not vllm: tools need hf") and measure.calls == []
    assert resolve("cpu", measure, shape=SHAPE, root=tmp_path, world_size=2).name == "hf" and measure.calls == []


def test_failed_measurement_falls_back_to_hf(vllm_installed, tmp_path):
    def broken(names):
        raise RuntimeError("vLLM could not start\nsecond line")

    choice = resolve("cpu", broken, shape=SHAPE, root=tmp_path)
    assert choice.name == "hf" and choice.reason == "the measurement failed (RuntimeError: vLLM could not start)"
    assert not list(tmp_path.rglob("*.json"))


def test_forced_choice_and_bad_forced_name(vllm_installed, tmp_path, monkeypatch):
    measure = Measure(hf=100.0, vllm=1.0)
    monkeypatch.setenv(engine_choice.FORCE_ENV, "vllm")
    assert resolve("cpu", measure, shape=SHAPE, root=tmp_path).name == "vllm" and measure.calls == []
    monkeypatch.setenv(engine_choice.FORCE_ENV, "vlm")
    with pytest.raises(ConfigError, match="GRPOKIT_ENGINE_AUTO='vlm' is not an engine"):
        resolve("cpu", measure, shape=SHAPE, root=tmp_path)


def test_choose_rule():
    # hf 100 tokens/s: a candidate needs > 105
    assert choose({"hf": 100.0, "vllm": 105.5})[0] == "vllm"
    assert choose({"hf": 100.0, "vllm": 105.0})[0] == "hf"
    with pytest.raises(ValueError, match="lack hf"):
        choose({"vllm": 1.0})


def test_config_accepts_auto_and_refuses_a_typo():
    assert GRPOConfig(engine="auto").engine == "auto"
    assert GRPOConfig(engine="auto", max_staleness=1).engine == "auto"  # auto resolves to hf where vllm can't
    with pytest.raises(ConfigError, match=r"engine='atuo' is not valid; .*auto\. Did you mean 'auto'"):
        engine_kind("atuo")
