"""Pure tensor math of the GRPO family: advantages, losses (a registry of them), KL estimators, log-probs, pass@k.

The names are imported on first use, so ``grpokit.algos.names`` (option lists and metric names, no
torch) can be imported by the config and the store without loading torch.
"""

import importlib

_WHERE = {
    "AGGREGATIONS": "names",
    "ESTIMATORS": "estimators",
    "IMPORTANCE_SAMPLING_LEVELS": "names",
    "KL_ESTIMATORS": "names",
    "LossSpec": "losses",
    "PolicyTerms": "losses",
    "SCALE_REWARDS": "names",
    "aggregate": "masked",
    "compute_advantages": "estimators",
    "entropy_from_logits": "logprobs",
    "get_loss": "loss_registry",
    "group_advantages": "advantages",
    "high_entropy_mask": "token_masks",
    "importance_log_ratio": "losses",
    "kl_estimate": "kl",
    "loss_types": "loss_registry",
    "masked_mean": "masked",
    "masked_sum": "masked",
    "off_policy_sequence_mask": "token_masks",
    "pass_at_k": "passk",
    "policy_loss": "losses",
    "register_loss": "loss_registry",
    "reinforce_pp_advantages": "advantages",
    "rloo_advantages": "advantages",
    "selective_logprobs": "logprobs",
    "truncated_importance_weights": "losses",
    "zero_variance_groups": "advantages",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module 'grpokit.algos' has no attribute {name!r}")
    return getattr(importlib.import_module(f"grpokit.algos.{_WHERE[name]}"), name)


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
