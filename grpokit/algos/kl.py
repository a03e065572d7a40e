"""Per-token estimators of KL(pi_theta || pi_ref) from log-probs of sampled tokens.

Schulman 2020, "Approximating KL Divergence" (http://joschu.net/blog/kl-approx.html). With
tokens sampled from pi_theta and d = ref_logprobs - logprobs = log(pi_ref / pi_theta):

- k1 = -d = logprobs - ref_logprobs          unbiased, high variance, can be negative
- k2 = d**2 / 2                               biased, low variance, >= 0
- k3 = exp(d) - d - 1                          unbiased, low variance, >= 0 (GRPO's choice)
"""

from __future__ import annotations

import torch

from grpokit.algos.names import KL_ESTIMATORS


def kl_estimate(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, kind: str = "k3") -> torch.Tensor:
    """Per-token KL estimate, [N, T] x [N, T] -> [N, T] (any matching shapes work)."""
    log_ratio = ref_logprobs - logprobs  # [N, T]
    if kind == "k1":
        return -log_ratio
    if kind == "k2":
        return 0.5 * log_ratio**2
    if kind == "k3":
        return torch.exp(log_ratio) - log_ratio - 1.0
    raise ValueError(f"unknown KL estimator {kind!r}; valid choices: {', '.join(KL_ESTIMATORS)}")
