"""The advantage estimators of the GRPO family by name (``advantage_estimator``): one advantage per completion from
the rewards of its group.

Each entry declares what it reads: ``compute(rewards [N], num_generations, algo) -> advantages [N]``, where
``algo`` is the algorithm's own section (``scale_rewards`` ...). Adding one is a function under the registry's
decorator, ``@ESTIMATORS.register("name")``; the config checks names against this table.
Importing this module loads no torch (the config validates names with it): the built-ins import
:mod:`grpokit.algos.advantages` when first called.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from grpokit.system.registry import Registry


@dataclass(frozen=True)
class Estimator:
    """An advantage estimator: ``compute(rewards [N], num_generations, algo) -> advantages [N]``."""

    compute: Callable[[Any, int, Any], Any]


ESTIMATORS = Registry("advantage_estimator", entry=lambda name, compute: Estimator(compute))


@ESTIMATORS.register("grpo")  # group z-score, scaled by scale_rewards
def _grpo(rewards, num_generations: int, algo):
    from grpokit.algos.advantages import group_advantages

    return group_advantages(rewards, num_generations, algo.scale_rewards)


@ESTIMATORS.register("rloo")  # leave-one-out baseline
def _rloo(rewards, num_generations: int, algo):
    from grpokit.algos.advantages import rloo_advantages

    return rloo_advantages(rewards, num_generations)


@ESTIMATORS.register("reinforce_pp")  # REINFORCE++ with group baseline
def _reinforce_pp(rewards, num_generations: int, algo):
    from grpokit.algos.advantages import reinforce_pp_advantages

    return reinforce_pp_advantages(rewards, num_generations)


def register_estimator(name: str, compute: Callable[[Any, int, Any], Any]) -> None:
    """Make ``compute`` the advantage estimator called ``name`` (``ESTIMATORS.register(name)`` as a call, replacing
    an entry of that name)."""
    ESTIMATORS.register(name, overwrite=True)(compute)


def get_estimator(name: str) -> Estimator:
    """The estimator called ``name``; a ValueError listing the names otherwise."""
    return ESTIMATORS.entry(name)


@dataclass(frozen=True)
class _Scale:
    scale_rewards: str


def compute_advantages(rewards, num_generations: int, estimator: str = "grpo", scale_rewards: str = "group"):
    """Advantages [N] by estimator name (``grpo`` uses ``scale_rewards``)."""
    return get_estimator(estimator).compute(rewards, num_generations, _Scale(scale_rewards))
