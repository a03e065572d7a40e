"""Reward functions: the contract, built-ins by name, and safe weighted scoring of batches.

Example::

    from grpokit.rewards import RewardRunner

    runner = RewardRunner(["accuracy", {"name": "format", "weight": 0.5}])
    result = runner.score(prompts, completions, {"answer": answers})
    result.combined, result.metrics()
"""

from grpokit.rewards.contract import MissingColumnError, RewardError
from grpokit.rewards.pool import LocalRewardPool, RewardPool
from grpokit.rewards.resolve import BUILTINS, get_reward, resolve_reward
from grpokit.rewards.runner import RewardResult, RewardRunner

__all__ = [
    "BUILTINS",
    "LocalRewardPool",
    "MissingColumnError",
    "RewardError",
    "RewardPool",
    "RewardResult",
    "RewardRunner",
    "get_reward",
    "resolve_reward",
]
