"""The algorithm's settings: how rewards become advantages (:mod:`grpokit.algos.algorithms`,
:mod:`grpokit.algos.estimators`), the policy loss (:mod:`grpokit.algos.losses`), its off-policy corrections
(:mod:`grpokit.algos.offpolicy`) and the KL controller (:mod:`grpokit.algos.kl_control`). Keys of the ``algo`` section
(the vLLM importance-sampling keys: of ``generation``, TRL's place), which are assembled from these classes;
torch-free."""

from __future__ import annotations

from dataclasses import dataclass, field


def require(ok: bool, message: str) -> None:
    """A ValueError naming the fix unless ``ok`` (the config reports it as a ConfigError; algos/ imports nothing of
    grpokit's outside it)."""
    if not ok:
        raise ValueError(message)


@dataclass
class AdvantageSettings:
    """The algorithm and how a group's rewards become advantages."""

    algorithm: str = "grpo"
    """grpo (the GRPO family: advantage_estimator, scale_rewards) | ppo (a learned value model, GAE)."""
    num_generations: int = 8
    """G: completions sampled per prompt."""
    scale_rewards: str = "group"
    """Advantage scaling: group | batch | none (Dr. GRPO)."""
    multi_objective_aggregation: str = "sum_then_normalize"
    """Several reward functions: sum_then_normalize (weighted sum, then the group advantage) | normalize_then_sum
    (TRL's GDPO: each function normalised in its group, weighted sum, then normalised over the batch)."""
    advantage_estimator: str = "grpo"
    """grpo | rloo | reinforce_pp, or one registered in algos/estimators.py by a module of `imports`."""

    def check(self) -> None:
        require(
            self.multi_objective_aggregation in ("sum_then_normalize", "normalize_then_sum"),
            f"multi_objective_aggregation={self.multi_objective_aggregation!r}: valid choices are sum_then_normalize, "
            "normalize_then_sum.",
        )
        require(
            self.multi_objective_aggregation == "sum_then_normalize" or self.advantage_estimator == "grpo",
            f"multi_objective_aggregation: normalize_then_sum normalises over the batch itself (TRL's GDPO); it "
            f"cannot be combined with advantage_estimator: {self.advantage_estimator}. Set advantage_estimator: grpo.",
        )


@dataclass
class PolicyLossSettings:
    """The policy loss: the clipped surrogate (or a registered loss), its KL term and masks."""

    beta: float = 0.04
    """KL coefficient against the reference model (the starting value under kl_controller: adaptive); 0 skips the
    reference pass."""
    use_bias_correction_kl: bool = False
    """Multiply each token's k3 KL term by its importance ratio (DeepSeek-V3.2; TRL 1.16's default)."""
    epsilon: float = 0.2
    """Lower clip range of the importance ratio."""
    epsilon_high: float | None = None
    """Upper clip range (DAPO clip-higher); defaults to epsilon. cispo: the cap of the importance weight itself (e.g.
    5.0)."""
    delta: float | None = None
    """Two-sided clipping (INTELLECT-2): the clipped surrogate's unclipped ratio is capped at delta too (above
    1 + epsilon_high, e.g. 4); null = off."""
    loss_type: str = "dapo"
    """The policy loss: grpo | bnpo | dr_grpo | dapo (the clipped surrogate, by aggregation) | cispo | sapo | luspo |
    vespo, or a loss registered by a module of `imports` (docs/from_trl.md)."""
    loss_params: dict = field(default_factory=dict)
    """The parameters of a loss registered by a module of `imports`, by name ({name: value}); a built-in loss's have
    keys of their own (sapo_temperature_pos ...)."""
    top_entropy_quantile: float = 1.0
    """rho in (0, 1]: the policy term only on each micro-batch's top-rho tokens by entropy ("Beyond the 80/20 Rule"
    uses 0.2); 1 = every token."""
    off_policy_mask_threshold: float | None = None
    """Drop from the policy term each sequence with a negative advantage whose mean log(mu / pi) since sampling
    exceeds this (DeepSeek-V3.2's off-policy sequence mask, e.g. 0.5); null = off."""
    importance_sampling_level: str = "token"
    """token | sequence (GSPO)."""
    num_iterations: int = 1
    """mu: policy updates per generated batch."""
    mask_truncated_completions: bool = False
    """Exclude completions that hit max_completion_length from the loss."""

    def check(self) -> None:
        require(self.epsilon > 0, f"epsilon={self.epsilon} must be > 0 (the clip range, e.g. 0.2).")
        require(
            self.epsilon_high is None or self.epsilon_high > 0, f"epsilon_high={self.epsilon_high} must be > 0 or null."
        )
        require(self.beta >= 0, f"beta={self.beta} must be >= 0 (0 disables the KL penalty).")
        require(self.num_iterations >= 1, f"num_iterations={self.num_iterations} must be >= 1.")
        require(
            self.delta is None or self.delta > 1,
            f"delta={self.delta} must be > 1 or null (the cap on the unclipped ratio, above 1 + epsilon_high, e.g. 4).",
        )
        require(
            0 <= self.top_entropy_quantile <= 1,
            f"top_entropy_quantile={self.top_entropy_quantile} must be in [0, 1] (the fraction of tokens trained on, "
            "by entropy; 1 = all, 0.2 in its paper).",
        )
        threshold = self.off_policy_mask_threshold
        require(
            threshold is None or threshold >= 0,
            f"off_policy_mask_threshold={threshold} must be >= 0 or null (a mean log-ratio, e.g. 0.5).",
        )


@dataclass
class OffPolicySettings:
    """Rollouts sampled ahead: how the loss corrects for the sampling policy."""

    off_policy_correction: str = "behaviour"
    """Rollouts sampled ahead (max_staleness >= 1): behaviour (ratio and clip against the sampling policy) |
    decoupled_ppo (AReaL: clip around the learner's own old log-probs, weighted by pi_old / mu shaped by
    off_policy_is_mode)."""
    off_policy_is_mode: str = "token_truncate"
    """decoupled_ppo: the weight pi_old / mu per token or per sequence, truncated or masked outside [off_policy_is_min,
    off_policy_is_max]: token_truncate | token_mask | sequence_truncate | sequence_mask (MIS) (TRL's
    vllm_importance_sampling_mode values)."""
    off_policy_is_min: float | None = None
    """decoupled_ppo: lower bound of the weight's range; null = none."""
    off_policy_is_max: float | None = 3.0
    """decoupled_ppo: upper bound of the weight's range; null = none."""

    def check(self) -> None:
        low, high = self.off_policy_is_min, self.off_policy_is_max
        require(
            (low is None or low >= 0) and (high is None or high > 0) and (low is None or high is None or low < high),
            f"off_policy_is_min={low}, off_policy_is_max={high}: need 0 <= min < max (null: unbounded on that side).",
        )


@dataclass
class SamplerCorrectionSettings:
    """A sampler with its own copy of the weights (vLLM): truncated importance sampling."""

    vllm_importance_sampling_correction: bool = True
    """engine vllm: weight each token's policy-gradient term by min(exp(logp_learner - logp_vllm), cap) (truncated
    importance sampling)."""
    vllm_importance_sampling_cap: float = 3.0
    """engine vllm: cap C of the truncated importance weight (>= 1); TRL's vllm_importance_sampling_clip_max."""
    vllm_importance_sampling_mode: str = "token_truncate"
    """engine vllm: token_truncate (each token's weight clamped to [clip_min, cap]) | token_mask (a token whose weight
    is outside them gets 0) | sequence_truncate | sequence_mask (one weight per sequence, exp of its summed
    log-ratios; TRL's default)."""
    vllm_importance_sampling_clip_min: float | None = None
    """engine vllm: lower bound of the importance weight (a floor in *_truncate, a cut in *_mask); null = none."""

    def check(self) -> None:
        require(
            self.vllm_importance_sampling_cap >= 1,
            f"vllm_importance_sampling_cap={self.vllm_importance_sampling_cap} must be >= 1 (weights are truncated at "
            "it; 1 never up-weights a token).",
        )
        modes = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")
        require(
            self.vllm_importance_sampling_mode in modes,
            f"vllm_importance_sampling_mode={self.vllm_importance_sampling_mode!r}: valid choices are "
            f"{', '.join(modes)}.",
        )
        low = self.vllm_importance_sampling_clip_min
        require(
            low is None or 0 <= low <= self.vllm_importance_sampling_cap,
            f"vllm_importance_sampling_clip_min={low} must be in [0, vllm_importance_sampling_cap="
            f"{self.vllm_importance_sampling_cap}] (or null for no lower bound).",
        )


@dataclass
class KLControlSettings:
    """The KL coefficient's controller, and the stop on too large a KL."""

    max_kl: float | None = None
    """Stop (with a checkpoint) when the mean KL exceeds this for max_kl_patience steps."""
    max_kl_patience: int = 1
    """Consecutive steps over max_kl before stopping."""
    kl_controller: str = "fixed"
    """fixed (beta stays) | adaptive: beta moves each step towards target_kl (Ziegler et al. 2019; verl's kl_ctrl)."""
    target_kl: float | None = None
    """KL the adaptive controller steers towards (e.g. 0.1); needs kl_controller: adaptive."""
    kl_horizon: float = 10000.0
    """Adaptive controller: each step beta changes by at most 20% x completions per step / kl_horizon."""

    def check(self) -> None:
        require(self.max_kl is None or self.max_kl > 0, f"max_kl={self.max_kl} must be > 0 or null.")
        require(self.max_kl_patience >= 1, f"max_kl_patience={self.max_kl_patience} must be >= 1.")
