"""Reward functions: the contract, built-ins by name, and safe weighted scoring of batches.

Example::

    from grpokit.rewards import RewardRunner

    runner = RewardRunner(["accuracy", {"name": "format", "weight": 0.5}])
    result = runner.score(prompts, completions, {"answer": answers})
    result.combined, result.metrics()


The names are imported on first use, so the package's settings (``grpokit.rewards.settings``) are read by the config
without loading torch."""

from grpokit.system.lazy import lazy_names

_WHERE = {
    "BUILTINS": "resolve",
    "LocalRewardPool": "pool",
    "MissingColumnError": "contract",
    "RewardError": "contract",
    "RewardPool": "pool",
    "RewardResult": "runner",
    "RewardRunner": "runner",
    "get_reward": "resolve",
    "resolve_reward": "resolve",
}

__all__ = sorted(_WHERE)


__getattr__ = lazy_names(__name__, _WHERE)
