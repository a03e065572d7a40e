"""Algorithms by name (``algo.algorithm``): what each one provides to the training loop.

An :class:`Algorithm` says whether it trains a critic, how few completions per prompt it accepts, how a
step's advantages come from its tensors (:class:`AdvantageInputs` -> :class:`AdvantageOutputs`) and which
settings it cannot run with (``check``, called by the config's validation). The trainer and the config ask this
registry and nothing else, so a new algorithm is one module under ``grpokit/algos/`` and one entry in
``ALGORITHMS``. Importing this module loads no torch (the config validates names and counts with it); the
advantage functions import their math when called.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from grpokit.system.registry import Registry

if TYPE_CHECKING:
    from collections.abc import Callable

    import torch


@dataclass(frozen=True)
class AdvantageInputs:
    """One step's tensors for an algorithm's advantages. N: the step's completions (every process's), n: this
    process's rows of them (``rows``), T: completion tokens.

    rewards: [N] combined rewards (NaN: no reward applies); num_generations: G, completions per prompt,
    adjacent; completion_mask: [n, T] the loss mask; old_logprobs / ref_logprobs: [n, T] the sampling
    policy's and the reference's log-probs, or None (not computed: the algorithm does not ask for them,
    or beta = 0); values: [n, T] the critic's values before the update (algorithms with a critic); beta: the
    step's KL coefficient (the adaptive controller's, else the config's).
    """

    rewards: torch.Tensor
    num_generations: int
    rows: slice
    completion_mask: torch.Tensor
    beta: float
    old_logprobs: torch.Tensor | None = None
    ref_logprobs: torch.Tensor | None = None
    values: torch.Tensor | None = None


@dataclass(frozen=True)
class AdvantageOutputs:
    """advantages: [n] (one per sequence) or [n, T] (one per token) for ``policy_loss``; per_sequence: [n], one
    number per completion for the store and the advantage metrics; returns: [n, T] the critic's targets
    (algorithms with a critic); loss_mask: [n, T] the tokens that enter the losses, when the algorithm leaves
    some out (None: the loss mask as given); metrics: floats logged with the step."""

    advantages: torch.Tensor
    per_sequence: torch.Tensor
    returns: torch.Tensor | None = None
    loss_mask: torch.Tensor | None = None
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Algorithm:
    """What an algorithm provides to the loop.

    name: its ``algo.algorithm`` value. min_generations: the fewest completions per prompt it can learn from.
    uses_critic: the trainer builds and trains a value model (``train/learning/critic.py``) and passes its values.
    needs_old_logprobs: ``(algo) -> bool``, the advantages read the sampling policy's log-probs (computed before
    the update). advantages: ``(inputs, algo) -> AdvantageOutputs``. validate: ``(algo, world_size)``: raises
    ValueError (one line naming the fix) for settings the algorithm cannot run with; :meth:`check` calls it, then
    checks ``min_generations``. ``algo`` is the config's ``algo`` section (``grpokit.config.training``'s
    AlgoConfig, not imported here: algos/ sits below config), the algorithm's own algo, read by name.
    """

    name: str
    min_generations: int
    uses_critic: bool
    advantages: Callable[[AdvantageInputs, Any], AdvantageOutputs]
    needs_old_logprobs: Callable[[Any], bool] = lambda algo: False
    validate: Callable[[Any, int], None] = lambda algo, world_size: None

    def check(self, algo: Any, world_size: int = 1) -> None:
        """The algorithm's own checks of the run's ``algo`` section (read by name); ValueError on the first that
        fails."""
        self.validate(algo, world_size)
        if algo.num_generations < self.min_generations:
            raise ValueError(f"num_generations={algo.num_generations} must be >= {self.min_generations}.")


ALGORITHMS = Registry(
    "algorithm", entry=lambda name, advantages, **fields: Algorithm(name, advantages=advantages, **fields)
)


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)


def _grpo_settings(algo: Any, world_size: int) -> None:
    """GRPO compares the completions of a group with a registered advantage estimator, and has no per-token rewards
    to fold a KL into."""
    from grpokit.algos.estimators import get_estimator

    get_estimator(algo.advantage_estimator)  # a ValueError naming the registered ones
    _require(
        algo.num_generations >= 2,
        f"num_generations={algo.num_generations}: GRPO needs at least 2 completions per prompt to compare them; "
        "set num_generations >= 2 (or algorithm: ppo, whose learned value needs no group).",
    )
    _require(
        not algo.kl_in_reward,
        f"kl_in_reward: true folds the KL into per-token rewards, which algorithm: {algo.algorithm} has none of; "
        "use algorithm: ppo, or kl_in_reward: false (the KL term in the loss).",
    )


def _ppo_settings(algo: Any, world_size: int) -> None:
    """PPO's GAE and value-loss options, its per-token advantages, and its one-process critic."""
    _require(0 <= algo.gamma <= 1, f"gamma={algo.gamma} must be in [0, 1] (GAE's discount; 1 = none).")
    _require(0 <= algo.lam <= 1, f"lam={algo.lam} must be in [0, 1] (GAE's lambda).")
    _require(algo.vf_coef > 0, f"vf_coef={algo.vf_coef} must be > 0 (the value loss's weight).")
    _require(algo.cliprange_value > 0, f"cliprange_value={algo.cliprange_value} must be > 0 (e.g. 0.2).")
    _require(
        algo.critic_learning_rate is None or algo.critic_learning_rate >= 0,
        f"critic_learning_rate={algo.critic_learning_rate} must be >= 0 or null (= learning_rate).",
    )
    _require(
        algo.importance_sampling_level == "token",
        "algorithm: ppo gives every token its own advantage, which a sequence-level ratio "
        "(importance_sampling_level: sequence, GSPO) cannot use; set importance_sampling_level: token.",
    )
    _require(
        world_size == 1,
        f"algorithm: ppo trains its critic in one process; this run has {world_size} (torchrun): run it as one "
        "process, or use algorithm: grpo.",
    )


@ALGORITHMS.register("grpo", min_generations=2, uses_critic=False, validate=_grpo_settings)
def _grpo_advantages(inputs: AdvantageInputs, algo: Any) -> AdvantageOutputs:
    """The GRPO family (``advantage_estimator``, ``scale_rewards``): one advantage per sequence from the rewards
    of its group, computed over every process's rows (complete groups) and sliced to this process's."""
    from grpokit.algos.estimators import get_estimator

    every = get_estimator(algo.advantage_estimator).compute(inputs.rewards, inputs.num_generations, algo)
    mine = every[inputs.rows].float().to(inputs.completion_mask.device)  # [n]
    return AdvantageOutputs(advantages=mine, per_sequence=mine)


@ALGORITHMS.register(
    "ppo",
    min_generations=1,
    uses_critic=True,
    needs_old_logprobs=lambda algo: algo.kl_in_reward and algo.beta > 0,
    validate=_ppo_settings,
)
def _ppo_advantages(inputs: AdvantageInputs, algo: Any) -> AdvantageOutputs:
    """PPO with a learned value (``algos.gae.ppo_advantages``): the reward on the last token, the KL folded in
    with ``kl_in_reward``, GAE with ``gamma`` and ``lam``, whitened over the tokens. A completion without a
    reward (NaN) leaves the losses (its loss mask is 0). Per sequence: the mean of its token advantages."""
    from grpokit.algos.gae import ppo_advantages
    from grpokit.algos.masked import masked_mean
    from grpokit.algos.value import explained_variance

    if inputs.values is None:
        raise ValueError("PPO's advantages need the critic's values")
    rewards = inputs.rewards[inputs.rows].to(inputs.values.device)  # [n]
    missing = rewards.isnan()  # [n]
    mask = inputs.completion_mask * (~missing).to(inputs.completion_mask.dtype)[:, None]  # [n, T]
    in_reward = algo.kl_in_reward and inputs.beta > 0
    advantages, returns, kl = ppo_advantages(
        rewards.nan_to_num(0.0).float(),
        inputs.values,
        mask,
        algo.gamma,
        algo.lam,
        old_logprobs=inputs.old_logprobs if in_reward else None,
        ref_logprobs=inputs.ref_logprobs if in_reward else None,
        beta=inputs.beta if in_reward else 0.0,
    )  # [n, T] each
    metrics = {
        "explained_variance": float(explained_variance(inputs.values, returns, mask)),
        "value/mean": float(masked_mean(inputs.values, mask)),
        "returns/mean": float(masked_mean(returns, mask)),
    }
    if kl is not None:  # the KL folded into the rewards: the run's KL (max_kl reads it)
        metrics["kl"] = float(masked_mean(kl, mask))
    per_sequence = masked_mean(advantages, mask, dim=-1)  # [n, T] -> [n]
    return AdvantageOutputs(advantages, per_sequence, returns, None if not missing.any() else mask, metrics)


def get_algorithm(name: str) -> Algorithm:
    """The algorithm called ``name``; a ValueError listing the names otherwise."""
    return ALGORITHMS.entry(name)
