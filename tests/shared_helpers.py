"""What tests share besides fixtures: the tiny vocabulary, the chat template, the reward file the runs score with.

A module with a name of its own (not ``conftest``), so that ``from shared_helpers import ...`` finds this file
whichever subset of the tree pytest collects (tests/real_vllm has a conftest.py of its own).
"""

from __future__ import annotations

import os

WORDS = [f"w{i}" for i in range(40)]
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }} : {{ m['content'] }} {% endfor %}"
    "{% if add_generation_prompt %}assistant :{% endif %}"
)
REWARD_FILE = os.path.join(os.path.dirname(__file__), "integration", "rewards_for_tests.py")
TARGET_REWARD = f"{REWARD_FILE}:target_fraction"


def loss_spec(**overrides):
    """A :class:`grpokit.algos.losses.LossSpec` for tests of the loss functions: dapo, clip 0.2, no KL, vLLM's
    truncated weights capped at 3 (TRL's), nothing else on; ``overrides`` change any field. The run's own LossSpec is
    derived from the config (``GRPOConfig.loss_spec``), whose defaults differ (beta 0.04)."""
    from grpokit.algos.losses import LossSpec

    base = dict(
        loss_type="dapo",
        epsilon=0.2,
        epsilon_high=None,
        beta=0.0,
        use_bias_correction_kl=False,
        importance_sampling_level="token",
        max_completion_length=None,
        sampling_cap=3.0,
        sampling_is_mode="token_truncate",
        sampling_is_min=None,
        delta=None,
        off_policy_mask_threshold=None,
    )
    return LossSpec(**{**base, **overrides})


def sampling_params(max_completion_length: int, temperature: float = 1.0, **overrides):
    """A :class:`grpokit.rollout.types.SamplingParams` for tests that sample: plain sampling at ``temperature``
    (``SamplingParams.plain``) with ``overrides`` (a filter, greedy, a logits rule)."""
    import dataclasses

    from grpokit.rollout.types import SamplingParams

    return dataclasses.replace(SamplingParams.plain(max_completion_length, temperature), **overrides)
