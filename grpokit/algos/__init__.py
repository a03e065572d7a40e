"""Pure tensor math of the GRPO family: advantages, losses, KL estimators, log-probs, pass@k."""

from grpokit.algos.advantages import (
    ESTIMATORS,
    SCALE_REWARDS,
    compute_advantages,
    group_advantages,
    reinforce_pp_advantages,
    rloo_advantages,
    zero_variance_groups,
)
from grpokit.algos.kl import KL_ESTIMATORS, kl_estimate
from grpokit.algos.logprobs import entropy_from_logits, selective_logprobs
from grpokit.algos.losses import (
    IMPORTANCE_SAMPLING_LEVELS,
    importance_log_ratio,
    policy_loss,
    truncated_importance_weights,
)
from grpokit.algos.masked import LOSS_TYPES, aggregate, masked_mean, masked_sum
from grpokit.algos.passk import pass_at_k

__all__ = [
    "ESTIMATORS",
    "IMPORTANCE_SAMPLING_LEVELS",
    "KL_ESTIMATORS",
    "LOSS_TYPES",
    "SCALE_REWARDS",
    "aggregate",
    "compute_advantages",
    "entropy_from_logits",
    "group_advantages",
    "importance_log_ratio",
    "kl_estimate",
    "masked_mean",
    "masked_sum",
    "pass_at_k",
    "policy_loss",
    "reinforce_pp_advantages",
    "rloo_advantages",
    "selective_logprobs",
    "truncated_importance_weights",
    "zero_variance_groups",
]
