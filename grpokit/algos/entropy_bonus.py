"""The entropy bonus of TRL's GRPOTrainer (``entropy_coef``), static or adaptive (Skywork-OR1, He et al. 2025,
"Skywork Open Reasoner 1 Technical Report", arXiv 2505.22312, section 3.2.2: adaptive entropy control).

The objective is L = L_policy - c x H, with H the mean entropy of the tokens the loss acts on (the loss mask, times
the high-entropy mask under ``top_entropy_quantile``), whatever the loss type's own normalisation; under gradient
accumulation each micro-batch adds c x H_micro / accumulation steps, as TRL does.

Adaptive control (``use_adaptive_entropy``): c applies only while the entropy measured on the previous optimizer
step is at most ``entropy_target`` (none before the first measurement); after each optimizer step, with H_step the
token-weighted mean entropy of all its micro-batches (every process's),

    c <- min(c + delta, c_max)   if H_step <= target
    c <- max(c - delta, c_min)   otherwise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


def mean_entropy(entropy: torch.Tensor, mask: torch.Tensor, tokens: torch.Tensor | float | None = None) -> torch.Tensor:
    """H = sum(entropy x mask) / tokens, tokens defaulting to sum(mask) (at least 1). ``entropy`` [N, T] (keeps its
    gradient), ``mask`` [N, T]; ``tokens``: the micro-batch's count when ``entropy`` is a chunk of its rows, so the
    chunks' terms add up to the micro-batch's H."""
    if tokens is None:
        tokens = mask.sum()
    tokens = torch.as_tensor(tokens, dtype=entropy.dtype, device=entropy.device).clamp(min=1.0)
    return (entropy * mask).sum() / tokens


def adaptive_entropy_coef(coef: float, entropy: float, target: float, delta: float, low: float, high: float) -> float:
    """Skywork-OR1's update of the coefficient after one optimizer step of mean entropy ``entropy``."""
    if entropy <= target:
        return min(coef + delta, high)
    return max(coef - delta, low)


@dataclass
class EntropyController:
    """The bonus's coefficient across optimizer steps (TRL's ``entropy_coef`` attribute).

    ``applied()`` is the coefficient every micro-batch of the current optimizer step uses; ``observe`` adds a
    micro-batch's (entropy sum, token count); ``step()`` ends the optimizer step (adaptive: measures and updates).
    ``state_dict`` / ``load_state_dict`` keep it in a checkpoint."""

    coef: float
    adaptive: bool
    target: float
    delta: float
    low: float
    high: float
    last_entropy: float = math.inf
    _sum: float = 0.0
    _count: float = 0.0

    @property
    def enabled(self) -> bool:
        """Whether the run has a bonus at all (adaptive: always, so it can come back after reaching 0)."""
        return self.coef != 0.0 or self.adaptive

    def applied(self) -> float:
        if self.adaptive:
            return self.coef if self.last_entropy <= self.target else 0.0
        return self.coef

    def observe(self, entropy_sum: float, tokens: float) -> None:
        self._sum += float(entropy_sum)
        self._count += float(tokens)

    def step(self, reduce=None) -> float:
        """End an optimizer step; ``reduce`` sums a list of floats over processes (None: one process). Returns the
        coefficient for the next step."""
        if self.adaptive:
            totals = [self._sum, self._count] if reduce is None else reduce([self._sum, self._count])
            self.last_entropy = totals[0] / max(totals[1], 1.0)
            self.coef = adaptive_entropy_coef(
                self.coef, self.last_entropy, self.target, self.delta, self.low, self.high
            )
        self._sum = self._count = 0.0
        return self.coef

    def state_dict(self) -> dict:
        return {"entropy_coef": self.coef, "last_world_entropy": self.last_entropy}

    def load_state_dict(self, state: dict) -> None:
        self.coef = float(state["entropy_coef"])
        self.last_entropy = float(state["last_world_entropy"])
