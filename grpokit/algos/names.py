"""The names the algorithms accept and report: option lists and the metric names of ``policy_loss``.

Each option list is defined here once: the function that implements the options checks its argument
against it, and ``grpokit.config`` validates the config with it. Each metric name is defined here once
and imported wherever the metric is read by name (the learner, the console, the report). This module
imports nothing, so the config, the store and the console can use these names without loading torch.
The loss types are not a fixed list: they are the registered losses (``loss_registry.loss_types()``).
"""

# --- options ------------------------------------------------------------------------------------
# How a loss's per-token values become one number (masked.aggregate), named after the loss that introduced each.
AGGREGATIONS = ("grpo", "bnpo", "dr_grpo", "dapo", "luspo")
# The aggregations that divide by the token count of the whole generation batch (num_items_in_batch), so the
# losses of its micro-batches add up; the others give each micro-batch's own mean.
BATCH_NORMALISED = ("dapo",)
SCALE_REWARDS = ("group", "batch", "none")  # advantages.group_advantages
IMPORTANCE_SAMPLING_LEVELS = ("token", "sequence")  # losses.importance_log_ratio
KL_ESTIMATORS = ("k1", "k2", "k3")  # kl.kl_estimate
KL_CONTROLLERS = ("fixed", "adaptive")  # kl_control.KLController
# offpolicy.behaviour_weights: TRL's vllm_importance_sampling_mode values, with TRL's meaning
IMPORTANCE_WEIGHT_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")
OFF_POLICY_CORRECTIONS = ("behaviour", "decoupled_ppo")  # offpolicy.CORRECTIONS

# --- metrics of losses.policy_loss (python floats) ---------------------------------------------
CLIP_LOW = "clip_ratio/low_mean"  # ratio < 1 - epsilon with A < 0
CLIP_HIGH = "clip_ratio/high_mean"  # ratio > 1 + epsilon_high with A > 0
CLIP_REGION = "clip_ratio/region_mean"  # either
RATIO_MEAN = "ratio_mean"
POLICY_LOSS = "policy_loss"  # the loss without the KL term
KL = "kl"  # masked mean of k3 (only with beta > 0)
IS_WEIGHT_MEAN = "sampling_is/weight_mean"  # with sampling log-probs (vLLM)
IS_CAPPED_FRACTION = "sampling_is/capped_fraction"  # tokens whose weight was truncated at a bound
IS_MASKED_FRACTION = "sampling_is/masked_fraction"  # tokens a mask mode set to weight 0 (offpolicy.behaviour_weights)
IS_WEIGHT_MAX = "sampling_is/weight_max"
IS_WEIGHT_MIN = "sampling_is/weight_min"
IS_LOGPROB_ABS_DIFF = "sampling_is/logprob_abs_diff"
CISPO_CLIP = "cispo_clip_ratio"  # cispo: ratio above its cap with A > 0 (the weight is capped)
VESPO_PHI = "vespo/phi_seq_mean"  # vespo: mean of the sequence weights phi(w) over sequences
OFF_POLICY_DROPPED = "off_policy_mask/dropped_fraction"  # sequences the off-policy mask left out
# policy_loss's other metrics are means over the micro-batch's tokens (or sequences). Those named here are the
# global batch's means in the log (the learner weighs each micro-batch's by its count, over every process:
# train/learning/batch_means.py): TOKEN_MEANS over the completion tokens, LEVEL_MEANS over the tokens, or the
# sequences at sequence level. The others, and a registered loss's own, are averaged over micro-batches.
TOKEN_MEANS = (KL, IS_WEIGHT_MEAN, IS_CAPPED_FRACTION, IS_MASKED_FRACTION, IS_LOGPROB_ABS_DIFF)
LEVEL_MEANS = (CLIP_LOW, CLIP_HIGH, CLIP_REGION, RATIO_MEAN, CISPO_CLIP)

# --- metrics of the trainer's step: the KL controller and DAPO's dynamic sampling ---------------
BETA = "beta"  # the KL coefficient the step's loss used (kl_control.KLController.beta before its update)
SAMPLING_ROUNDS = "dynamic_sampling/rounds"  # rounds sampled in the step (1 = no extra round)
SAMPLING_PROMPTS = "dynamic_sampling/prompts"  # prompts (groups) sampled in the step, dropped ones included
SAMPLING_GROUPS_TRAINED = "dynamic_sampling/groups_trained"  # informative groups the step trained on
SAMPLING_SHORT = "dynamic_sampling/short"  # 1.0: the cap on rounds stopped it before the batch was full
