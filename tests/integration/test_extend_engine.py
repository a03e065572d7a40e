"""Adding a built-in engine with one setting touches the files docs/architecture.md names, and no others: in a copy of
the package, a new module of grpokit/rollout/ (its torch-free settings class, with its check, and ``build``), its
``ENGINES.register("capped", settings=...)`` line in grpokit/rollout/engines.py beside the other built-ins, its
settings class among GenerationConfig's bases (so its field is a ``generation`` key), and typed_keys.py regenerated.
Then ``grpokit train`` on the copy samples with it, the setting arriving from the YAML, from ``key=value`` and from
``generation.engine_params``, and its check refuses a bad value."""

from __future__ import annotations

import pytest
from package_copy import assert_changes_are_the_pages
from shared_helpers import logged_steps, tiny_run_config

ENGINE = "rollout/capped_engine.py"
ENGINE_MODULE = '''"""capped: grpokit's own sampler with each completion cut at ``capped_tokens`` tokens (a test's
built-in engine). Torch-free: the config imports its settings; the engine is imported when one is built."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass


@dataclass
class CappedSettings:
    """The capped engine's setting."""

    capped_tokens: int = 8
    """capped engine: the most tokens a completion has (below max_completion_length to matter)."""

    def check(self) -> None:
        if self.capped_tokens < 1:
            raise ValueError(f"capped_tokens={self.capped_tokens} must be >= 1 (the tokens a completion may have).")


class CappedEngine:
    """``inner`` (an engine) sampling completions of at most ``cap`` tokens; everything else is ``inner``'s."""

    def __init__(self, inner, cap: int) -> None:
        self.inner, self.cap = inner, cap

    def generate(self, prompt_ids, num_generations, params):
        capped = dataclasses.replace(params, max_completion_length=min(params.max_completion_length, self.cap))
        return self.inner.generate(prompt_ids, num_generations, capped)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def build(parts, settings: CappedSettings) -> CappedEngine:
    from grpokit.rollout.engine import HFRolloutEngine

    inner = HFRolloutEngine(
        parts.model, parts.eos_token_ids, parts.pad_token_id, parts.device, seed=parts.seed,
        autocast_dtype=parts.autocast_dtype, kernels=parts.kernels,
    )
    return CappedEngine(inner, settings.capped_tokens)
'''
REGISTER = """

ENGINES.register("capped", settings=CappedSettings)(build_capped)
"""
EXPECTED = {ENGINE, "rollout/engines.py", "config/training.py", "config/typed_keys.py"}


@pytest.fixture(scope="module")
def extended(package_copy):
    package_copy.add(ENGINE, ENGINE_MODULE)
    vllm = "from grpokit.rollout.vllm.settings import VLLMSettings, vllm_spec"
    capped = "from grpokit.rollout.capped_engine import CappedSettings\n"
    transformers = '@ENGINES.register("transformers"'  # the line's start: its arguments may change
    package_copy.edit(
        "rollout/engines.py",
        (vllm, f"{capped}from grpokit.rollout.capped_engine import build as build_capped\n{vllm}"),
        (transformers, f"{REGISTER.lstrip()}\n\n{transformers}"),
    )
    package_copy.edit(
        "config/training.py",
        ("from grpokit.rollout.sampling_settings", f"{capped}from grpokit.rollout.sampling_settings"),
        ("SamplingSettings, VLLMSettings):", "SamplingSettings, VLLMSettings, CappedSettings):"),
    )
    package_copy.regenerate_typed_keys()
    return package_copy


def test_an_engine_touches_the_files_the_page_names(extended):
    assert_changes_are_the_pages(extended, "An engine", EXPECTED)


@pytest.mark.usefixtures("one_thread")
def test_the_engine_samples_with_its_setting_from_each_way_in(extended, tmp_path, tiny_model_dir):
    config = tiny_run_config(tmp_path, tiny_model_dir, max_steps=1, generation={"engine": "capped", "capped_tokens": 1})
    runs = {cap: tmp_path / f"run{cap}" for cap in (1, 2, 3)}
    codes, stderr = extended.cli_runs(
        ["train", config, "capped_tokens=0"],
        ["train", config, f"output_dir={runs[1]}"],  # the YAML's capped_tokens: 1
        ["train", config, "capped_tokens=2", f"output_dir={runs[2]}"],
        ["train", config, "engine_params={capped_tokens: 3}", f"output_dir={runs[3]}"],
    )
    assert codes == [2, 0, 0, 0], stderr[-3000:]
    assert "grpokit: error: capped_tokens=0 must be >= 1 (the tokens a completion may have)." in stderr.splitlines()
    for cap, run in runs.items():  # max_completion_length is 4: each run's longest completion is its cap
        (step,) = logged_steps(run)
        assert step["completion_length/max"] == cap, (cap, step["completion_length/max"])
