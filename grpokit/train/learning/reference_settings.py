"""The reference model's resync (:mod:`grpokit.train.learning.reference`): keys of the ``algo`` section, which is
assembled from this class; torch-free."""

from __future__ import annotations

from dataclasses import dataclass

from grpokit.errors import require


@dataclass
class ReferenceSettings:
    """TR-DPO's periodic resync of the reference towards the policy."""

    ref_model_sync_steps: int = 0
    """Every this many steps, pi_ref = alpha * pi_theta + (1 - alpha) * pi_ref; 0 = never."""
    ref_model_mixup_alpha: float = 0.6
    """alpha of the reference resync."""

    def check(self) -> None:
        alpha, steps = self.ref_model_mixup_alpha, self.ref_model_sync_steps
        require(0.0 <= alpha <= 1.0, f"ref_model_mixup_alpha={alpha} must be in [0, 1].")
        require(steps >= 0, f"ref_model_sync_steps={steps} must be >= 0 (0 = never).")
