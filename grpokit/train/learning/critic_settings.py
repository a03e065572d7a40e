"""PPO's critic's settings (:mod:`grpokit.train.learning.critic`): keys of the ``algo`` section (TRL PPOConfig's
names; the policy's clip range is epsilon, its passes num_iterations), which is assembled from this class;
torch-free."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class CriticSettings:
    """algorithm: ppo only: the value model, its loss and GAE."""

    value_model_name_or_path: str | None = None
    """ppo: the critic's trunk, a causal LM or a one-label token classifier; null = a copy of the policy's."""
    critic_learning_rate: float | None = None
    """ppo: the critic's AdamW learning rate (same schedule as the policy's); null = learning_rate."""
    vf_coef: float = 0.1
    """ppo: weight of the value loss (the critic has its own AdamW, so it scales the gradient that max_grad_norm
    clips)."""
    cliprange_value: float = 0.2
    """ppo: the value loss clips the new values to old +- cliprange_value."""
    gamma: float = 1.0
    """ppo: discount of GAE."""
    lam: float = 0.95
    """ppo: lambda of GAE."""
    kl_in_reward: bool = False
    """ppo: the per-token KL (k1, beta) is subtracted from the rewards instead of added to the loss (InstructGPT)."""
