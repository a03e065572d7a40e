"""Adding a loss with its own parameter, an engine and an advantage estimator: each is one new module (written here,
as a user writes it) with one registry line, named in ``algo.imports``; each trains one step through the Python
API on a tiny model, with no other edit to grpokit."""

from __future__ import annotations

import functools
import json
import textwrap
from pathlib import Path

import pytest
from shared_helpers import TARGET_REWARD, tiny_args

from grpokit import GRPOConfig, GRPOTrainer
from grpokit.config import ConfigError
from grpokit.store import RolloutStore

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(autouse=True)
def registries_restored():
    """What a test registers stays in its test: the registries are as before afterwards."""
    from grpokit.algos.estimators import ESTIMATORS
    from grpokit.algos.loss_registry import LOSSES, loss_types
    from grpokit.rollout.engines import ENGINES

    loss_types()  # the built-in losses registered first (their modules register them once)
    from grpokit.rewards.resolve import BUILTINS  # the built-in rewards registered first

    saved = [(table, dict(table)) for table in (LOSSES, ENGINES, ESTIMATORS, BUILTINS)]
    yield
    for table, before in saved:
        table.clear()
        table.update(before)


# REINFORCE scaled by its one parameter; its metric shows the parameter reached the loss.
TOY_LOSS = """
from dataclasses import dataclass

from grpokit.algos import register_loss


@dataclass(frozen=True)
class ScaleParams:
    toy_scale: float = 1.0


def check(settings):
    if not settings.params.toy_scale > 0:
        raise ValueError(f"toy_scale={settings.params.toy_scale} must be > 0.")
    return []


def scaled_reinforce(terms, spec):
    per_token = -spec.params.toy_scale * terms.advantages * terms.logprobs  # [N, 1] x [N, T]
    return per_token, {"toy/scale": spec.params.toy_scale}


register_loss("toy_scaled", aggregation="bnpo", params=ScaleParams, check=check)(scaled_reinforce)  # LOSSES.register
"""

# grpokit's own sampler, counting its calls.
TOY_ENGINE = """
from grpokit.rollout.engine import HFRolloutEngine
from grpokit.rollout.engines import ENGINES

CALLS = []


class CountingEngine(HFRolloutEngine):
    def generate(self, *args, **kwargs):
        CALLS.append(1)
        return super().generate(*args, **kwargs)


@ENGINES.register("toy_counting")
def build(parts, spec):
    assert spec is None  # it declared no settings, so it gets none
    return CountingEngine(
        parts.model, parts.eos_token_ids, parts.pad_token_id, parts.device, seed=parts.seed,
        autocast_dtype=parts.autocast_dtype, kernels=parts.kernels,
    )

"""

# grpokit's own sampler with one setting of its own: every toy_stride-th call counted. The settings class is the
# whole declaration: its field (default and doc line) and its check; the run passes it through engine_params.
TOY_ENGINE_WITH_SETTING = """
from dataclasses import dataclass
from grpokit.rollout.engine import HFRolloutEngine
from grpokit.rollout.engines import ENGINES
SEEN = []
@dataclass
class StrideSettings:
    toy_stride: int = 1
    \"\"\"Count every toy_stride-th generate call.\"\"\"
    def check(self):
        if self.toy_stride < 1:
            raise ValueError(f"toy_stride={self.toy_stride} must be >= 1.")
@ENGINES.register("toy_strided", settings=StrideSettings)
def build(parts, settings):
    SEEN.append(settings)
    return HFRolloutEngine(parts.model, parts.eos_token_ids, parts.pad_token_id, parts.device, seed=parts.seed)
"""

# A built-in reward: a class whose constructor takes its parameters, named by the registry's decorator.
TOY_REWARD = """
from grpokit.rewards.registry import BUILTINS
@BUILTINS.register("has_word")
class HasWord:
    name = "has_word"
    def __init__(self, word: str):
        self.word = word
    def __call__(self, completions, **kwargs):
        return [float(self.word in c) for c in completions]
"""

# +1 above the group's mean reward, -1 below, 0 at it.
TOY_ESTIMATOR = """
import torch

from grpokit.algos.estimators import ESTIMATORS


@ESTIMATORS.register("toy_sign")
def sign_advantages(rewards, num_generations, settings):
    groups = rewards.view(-1, num_generations)
    return torch.sign(groups - groups.mean(dim=1, keepdim=True)).reshape(-1)
"""


# each extension trains one step of the tiny run, with no checkpoint
one_step_args = functools.partial(tiny_args, max_steps=1, max_completion_length=5, save_strategy="no")


def one_step(tmp_path: Path, model_dir: Path, prompts: list, module: str, source: str, **settings) -> Path:
    (tmp_path / f"{module}.py").write_text(textwrap.dedent(source))
    run = tmp_path / "run"
    args = one_step_args(run, imports=[str(tmp_path / f"{module}.py")], learning_rate=1e-3, **settings)
    GRPOTrainer(str(model_dir), TARGET_REWARD, args=args, train_dataset=prompts).train()
    return run


def metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_a_loss_with_its_own_parameter(tmp_path, tiny_model_dir, word_prompts):
    run = one_step(
        tmp_path,
        tiny_model_dir,
        word_prompts,
        "toy_loss",
        TOY_LOSS,
        loss_type="toy_scaled",
        loss_params={"toy_scale": 0.5},
    )
    (step,) = [m for m in metrics(run) if "loss" in m]
    assert step["toy/scale"] == 0.5  # the parameter reached the loss
    with pytest.raises(ConfigError, match=r"toy_scale=-1 must be > 0"):  # the loss's own check
        GRPOConfig(imports=[str(tmp_path / "toy_loss.py")], loss_type="toy_scaled", loss_params={"toy_scale": -1})
    with pytest.raises(ConfigError, match=r"loss_params \['scale'\]: loss_type toy_scaled has no such parameter"):
        GRPOConfig(imports=[str(tmp_path / "toy_loss.py")], loss_type="toy_scaled", loss_params={"scale": 2})


def test_an_engine(tmp_path, tiny_model_dir, word_prompts):
    from grpokit.rollout.engines import ENGINES

    run = one_step(tmp_path, tiny_model_dir, word_prompts, "toy_engine", TOY_ENGINE, engine="toy_counting")
    assert len(ENGINES["toy_counting"].build.__globals__["CALLS"]) >= 1  # the registered engine sampled the step
    assert [m for m in metrics(run) if "loss" in m]
    with pytest.raises(
        ConfigError,
        match=r"engine='toy_countin' is not valid; choose one of hf, vllm, transformers, toy_counting, auto\. Did you",
    ):
        GRPOTrainer(
            str(tiny_model_dir), TARGET_REWARD, args=GRPOConfig(engine="toy_countin"), train_dataset=word_prompts
        )


def test_an_advantage_estimator(tmp_path, tiny_model_dir, word_prompts):
    run = one_step(
        tmp_path, tiny_model_dir, word_prompts, "toy_estimator", TOY_ESTIMATOR, advantage_estimator="toy_sign"
    )
    with RolloutStore(run, readonly=True) as store:
        advantages = {r["advantage"] for r in store.rollouts()}
    assert advantages and advantages <= {-1.0, 0.0, 1.0}
    with pytest.raises(ConfigError, match=r"unknown advantage_estimator 'toy_sig'"):
        GRPOConfig(advantage_estimator="toy_sig")


def test_an_engine_with_one_setting(tmp_path, tiny_model_dir, word_prompts):
    from grpokit.rollout.engines import ENGINES

    settings = {"engine": "toy_strided", "engine_params": {"toy_stride": 3}}
    one_step(tmp_path, tiny_model_dir, word_prompts, "toy_strided", TOY_ENGINE_WITH_SETTING, **settings)
    (seen,) = ENGINES["toy_strided"].build.__globals__["SEEN"]
    assert seen.toy_stride == 3  # the setting reached the engine's build, as its own settings object
    module = str(tmp_path / "toy_strided.py")
    with pytest.raises(ConfigError, match=r"toy_stride=0 must be >= 1"):  # the settings' own check, before a model
        GRPOConfig(imports=[module], engine="toy_strided", engine_params={"toy_stride": 0})
    with pytest.raises(ConfigError, match=r"engine_params \['stride'\]: engine toy_strided has no such setting"):
        GRPOConfig(imports=[module], engine="toy_strided", engine_params={"stride": 2})
    with pytest.raises(ConfigError, match=r"engine_params \['toy_stride'\]: engine hf has no settings"):
        GRPOConfig(imports=[module], engine="hf", engine_params={"toy_stride": 2})


def test_a_builtin_reward(tmp_path, tiny_model_dir, word_prompts):
    (tmp_path / "toy_reward.py").write_text(textwrap.dedent(TOY_REWARD))
    run = tmp_path / "run"
    args = one_step_args(run, imports=[str(tmp_path / "toy_reward.py")], rewards=[{"name": "has_word", "word": "w7"}])
    GRPOTrainer(str(tiny_model_dir), args=args, train_dataset=word_prompts).train()
    with RolloutStore(run, readonly=True) as store:
        rows = store.rollouts()
    assert rows and all(r["reward"] == float("w7" in r["completion"]) for r in rows)  # its parameter reached it
