"""The KL coefficient beta across steps: fixed, or adapted towards a target KL.

Ziegler et al. 2019, "Fine-Tuning Language Models from Human Preferences", section 2.2:

    e_t = clip(KL_t / KL_target - 1, -0.2, 0.2)
    beta_{t+1} = beta_t * (1 + K_beta * e_t),  K_beta = n_steps / horizon

where KL_t is the KL measured on the step's batch and n_steps the number of samples it used (verl
and TRL's former PPOTrainer pass the batch size). Any algorithm can use it: the coefficient of a KL
in the reward (``algos.gae.kl_in_reward``) or of the KL term of the loss (``algos.losses``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

# Ziegler et al.'s clip on the proportional error.
MAX_PROPORTIONAL_ERROR = 0.2


def adaptive_kl_coef(beta: float, current_kl: float, target_kl: float, horizon: float, n_steps: int) -> float:
    """beta after one step of Ziegler et al.'s proportional controller (formula in the module docstring)."""
    error = min(max(current_kl / target_kl - 1.0, -MAX_PROPORTIONAL_ERROR), MAX_PROPORTIONAL_ERROR)
    return beta * (1.0 + error * n_steps / horizon)


@dataclass
class KLController:
    """The KL coefficient ``beta`` and its rule: fixed when ``target_kl`` is None, else adaptive.

    ``update`` once per step with the measured KL; ``state_dict`` / ``load_state_dict`` keep it in a
    checkpoint (plain floats, so a resumed run continues with the same beta).
    """

    beta: float
    target_kl: float | None
    horizon: float

    def __post_init__(self):
        if self.beta < 0:
            raise ValueError(f"the KL coefficient beta must be >= 0, got {self.beta}")
        if self.target_kl is not None and self.target_kl <= 0:
            raise ValueError(f"target_kl must be > 0 (or None for a fixed beta), got {self.target_kl}")
        if self.horizon <= 0:
            raise ValueError(f"the adaptive KL horizon must be > 0, got {self.horizon}")

    @property
    def adaptive(self) -> bool:
        return self.target_kl is not None

    def update(self, current_kl: float, n_steps: int) -> float:
        """Adapt beta to the KL measured on a step of ``n_steps`` samples; return the new beta."""
        if self.adaptive:
            self.beta = adaptive_kl_coef(self.beta, float(current_kl), self.target_kl, self.horizon, n_steps)
        return self.beta

    def state_dict(self) -> dict:
        return asdict(self)

    def load_state_dict(self, state: dict) -> None:
        if set(state) != {"beta", "target_kl", "horizon"}:
            raise ValueError(f"not a KL controller state: keys {sorted(state)}")
        self.beta, self.target_kl, self.horizon = state["beta"], state["target_kl"], state["horizon"]
