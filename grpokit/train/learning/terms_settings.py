"""The extra loss terms' settings (:class:`grpokit.train.learning.loss_terms.LossTerms`): TRL's entropy bonus
(static or adaptive) and a mixture-of-experts router's load-balancing loss. Keys of the ``algo`` section, which is
assembled from this class; torch-free, so the config reads it without loading torch."""

from __future__ import annotations

from dataclasses import dataclass

from grpokit.errors import require


@dataclass
class LossTermsSettings:
    """TRL's keys, TRL's meaning (docs/from_trl.md)."""

    entropy_coef: float = 0.0
    """Entropy bonus: the objective is the policy loss - entropy_coef x the mean entropy of the tokens it acts on
    (TRL's; the starting value under use_adaptive_entropy); 0 = off."""
    use_adaptive_entropy: bool = False
    """Skywork-OR1's adaptive entropy control: the bonus applies while the last step's entropy <= entropy_target, and
    entropy_coef moves by entropy_coef_delta each optimizer step (up while below the target, else down)."""
    entropy_target: float = 0.2
    """use_adaptive_entropy: the mean token entropy to hold."""
    entropy_coef_delta: float = 0.005
    """use_adaptive_entropy: entropy_coef's change per optimizer step."""
    entropy_coef_min: float = 0.0
    """use_adaptive_entropy: entropy_coef's lower bound."""
    entropy_coef_max: float = 1.0
    """use_adaptive_entropy: entropy_coef's upper bound."""
    router_aux_loss_coef: float | None = None
    """Mixture-of-experts models: weight of the routers' load-balancing loss added to the objective; null = the model
    config's own router_aux_loss_coef (on for an MoE model that declares one, as in TRL)."""

    def check(self) -> None:
        require(
            self.entropy_coef_min <= self.entropy_coef_max and self.entropy_coef_delta >= 0,
            f"entropy_coef_min={self.entropy_coef_min}, entropy_coef_max={self.entropy_coef_max}, entropy_coef_delta="
            f"{self.entropy_coef_delta}: the bounds must be in order (min <= max) and the step >= 0.",
        )
