"""A GRPOTrainer whose model's ``generate`` was replaced samples through it, as TRL does without vLLM.

TRL samples with ``model.generate`` unless ``use_vllm``, so a TRL script (or test) may replace it on the instance,
``unittest.mock.patch.object(trainer.model, "generate", side_effect=fake)`` between building the trainer and
``train()``, to script the completions. grpokit samples with its own decoder by default, which would never call it.
When ``train()`` starts and ``"generate" in vars(model)`` while the config did not name an engine (the default hf,
not given), the run samples with ``generation.engine: transformers`` from then on (single-turn:
:class:`~grpokit.rollout.transformers_engine.TransformersRolloutEngine`; tools:
:class:`~grpokit.rollout.transformers_multiturn.TransformersMultiTurnEngine`, TRL's round loop), from the hf engine's
random stream and at its policy version, and says so in one line.
"""

from __future__ import annotations

import sys

from grpokit.rollout.engine import HFRolloutEngine
from grpokit.rollout.transformers_engine import TransformersRolloutEngine

NOTE = (
    "grpokit: the model's generate was replaced on the instance (e.g. unittest.mock.patch.object); this run samples "
    "with it, as TRL does without vLLM (generation.engine: transformers; docs/from_trl.md)."
)


class FollowingTransformersEngine(TransformersRolloutEngine):
    """transformers' generate sampling for an hf ``leader`` engine: its model, ids, autocast, random stream and
    policy version (which the run's updates move on the leader)."""

    def __init__(self, leader: HFRolloutEngine):
        self.leader, version = leader, leader.policy_version
        eos = leader.eos_token_ids.tolist()
        super().__init__(leader.model, eos, leader.pad_token_id, leader.device, autocast_dtype=leader.autocast_dtype)
        self.generator, leader.policy_version = leader.generator, version  # __init__ set the version to 0

    @property
    def policy_version(self) -> int:
        return self.leader.policy_version

    @policy_version.setter
    def policy_version(self, value: int) -> None:
        self.leader.policy_version = value

    def sync_weights(self) -> None:
        self.leader.sync_weights()


def follows_patched_generate(config, model, engine) -> bool:
    """Whether the run must sample with its model's replaced ``generate``: it is set on the instance, the config
    left ``generation.engine`` at its default hf, and the engine is grpokit's hf sampler in this process."""
    replaced = "generate" in vars(model) or "generate" in vars(getattr(model, "get_base_model", lambda: model)())
    named = config.is_given("engine") or config.engine != "hf"
    return replaced and not named and isinstance(engine, HFRolloutEngine)


def sample_with_patched_generate(run) -> bool:
    """Switch ``run`` to transformers' generate when :func:`follows_patched_generate` (once; the note printed on the
    main process); True when it samples with it now."""
    engine = run.engine
    if isinstance(engine, HFRolloutEngine) and isinstance(engine.generate_with, FollowingTransformersEngine):
        return True
    if not follows_patched_generate(run.config, run.model, engine):
        return False
    follower = FollowingTransformersEngine(engine)
    engine.generate_with = follower
    tools = run.rollout_scheduler.tool_rollouts
    if tools is not None:
        tools.use_engine("transformers-multi-turn", follower)
    if run.procs.is_main:
        print(NOTE, file=sys.stderr)
    return True
