"""Every key of ``GRPOConfig``'s sections with its type, for editors and type checkers: generated from the
config's sections by ``python scripts/gen_config_reference.py`` (a test checks it is current); do not edit by
hand. Annotations only: at run time GRPOConfig reads each key from its section (``cfg.algo.beta``); the
TRL-only keys are in typed_trl_keys.py."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from grpokit.config.typed_trl_keys import TypedTrlKeys

if TYPE_CHECKING:
    from grpokit.config.running import AgentConfig, DistributedConfig, EvalConfig, RunConfig
    from grpokit.config.training import AlgoConfig, DataConfig, GenerationConfig, ModelConfig, OptimConfig
    from grpokit.models.lora_settings import LoraSettings
    from grpokit.rewards.settings import RewardSettings


class TypedKeys(TypedTrlKeys):
    """The sections, then each section's keys (the TRL-only keys: the base class)."""

    model: ModelConfig
    data: DataConfig
    algo: AlgoConfig
    generation: GenerationConfig
    optim: OptimConfig
    run: RunConfig
    eval: EvalConfig
    lora: LoraSettings
    distributed: DistributedConfig
    reward: RewardSettings
    agent: AgentConfig
    # model
    model_name_or_path: str | None
    tokenizer_name_or_path: str | None
    dtype: str
    mixed_precision: str
    device: str
    trust_remote_code: bool
    gradient_checkpointing: bool
    load_in_4bit: bool
    ref_model_dtype: str
    freeze_vision_tower: bool
    freeze_projector: bool
    # data
    train_dataset: str | dict | None
    eval_dataset: str | dict | None
    prompt_column: str
    prompt_template: str | None
    system_prompt: str | None
    use_chat_template: bool | None
    max_prompt_length: int | None
    prompt_overflow: str
    shuffle: bool
    image_column: str | None
    curriculum: str
    history_window: int
    learnability_prior: float
    learnability_floor: float
    pool_easy_above: float
    pool_hard_below: float
    pool_weights: list
    retire_after: int | None
    retire_revisit: float
    # algo
    imports: list
    entropy_coef: float
    use_adaptive_entropy: bool
    entropy_target: float
    entropy_coef_delta: float
    entropy_coef_min: float
    entropy_coef_max: float
    router_aux_loss_coef: float | None
    vespo_k_pos: float
    vespo_lambda_pos: float
    vespo_k_neg: float
    vespo_lambda_neg: float
    sapo_temperature_pos: float
    sapo_temperature_neg: float
    value_model_name_or_path: str | None
    critic_learning_rate: float | None
    vf_coef: float
    cliprange_value: float
    gamma: float
    lam: float
    kl_in_reward: bool
    algorithm: str
    num_generations: int
    scale_rewards: str
    multi_objective_aggregation: str
    advantage_estimator: str
    beta: float
    use_bias_correction_kl: bool
    epsilon: float
    epsilon_high: float | None
    delta: float | None
    loss_type: str
    loss_params: dict
    top_entropy_quantile: float
    off_policy_mask_threshold: float | None
    importance_sampling_level: str
    num_iterations: int
    mask_truncated_completions: bool
    off_policy_correction: str
    off_policy_is_mode: str
    off_policy_is_min: float | None
    off_policy_is_max: float | None
    ref_model_sync_steps: int
    ref_model_mixup_alpha: float
    max_kl: float | None
    max_kl_patience: int
    kl_controller: str
    target_kl: float | None
    kl_horizon: float
    dynamic_sampling: bool
    max_sampling_rounds: int
    teacher_model_name_or_path: str | None
    teacher_server_url: str | None
    distill_coef: float
    distill_loss: str
    distill_topk: int
    teacher_temperature: float
    teacher_dtype: str
    teacher_device: str | None
    teacher_server_api_key: str | None
    teacher_server_timeout: float
    # generation
    vllm_gpu_memory_utilization: float
    vllm_max_model_length: int | None
    vllm_enable_sleep_mode: bool | None
    vllm_dtype: str
    vllm_enforce_eager: bool | None
    vllm_kv_cache_gib: float | None
    vllm_mode: str
    vllm_server_base_url: str | None
    vllm_server_host: str
    vllm_server_port: int
    vllm_server_api_key: str | None
    vllm_server_timeout: float
    vllm_max_logprob_gap: float | None
    vllm_tensor_parallel_size: int
    vllm_partial_rollout_tokens: int | None
    vllm_partial_rollout_timeout: float
    max_completion_length: int
    temperature: float
    top_p: float
    top_k: int
    min_p: float
    repetition_penalty: float
    generation_kwargs: dict | None
    engine: str
    engine_params: dict
    vllm_importance_sampling_correction: bool
    vllm_importance_sampling_cap: float
    vllm_importance_sampling_mode: str
    vllm_importance_sampling_clip_min: float | None
    # optim
    learning_rate: float
    weight_decay: float
    adam_beta1: float
    adam_beta2: float
    adam_epsilon: float
    optimizer: str
    lr_scheduler_type: str
    warmup_ratio: float
    warmup_steps: int
    max_grad_norm: float
    per_device_train_batch_size: int
    backward_chunk_rows: int | None
    gradient_accumulation_steps: int
    num_mini_batches: int
    max_steps: int
    num_train_epochs: float
    seed: int
    # run
    store_token_values: list
    log_multimodal: bool
    store_images_max_mb: float | None
    output_dir: str
    resume_from: str | None
    overwrite: bool
    save_strategy: str
    save_steps: int
    save_total_limit: int | None
    report_to: list
    logging_steps: int
    progress_bar: bool
    log_completions: bool
    num_completions_to_print: int | None
    max_nonfinite_steps: int
    warn_tied_steps: int
    # eval
    eval_strategy: str
    eval_steps: int
    num_generations_eval: int
    pass_at_k: list
    eval_temperature: float | None
    max_eval_prompts: int | None
    success_threshold: float
    eval_rewards: list | None
    # lora
    r: int
    alpha: int
    dropout: float
    target_modules: Any
    merge_on_save: bool
    # distributed
    backend: str
    address: str | None
    num_rollout_workers: int
    rollout_worker_cpus: float
    rollout_worker_gpus: float
    ray_num_cpus: int | None
    seed_per_group: bool
    async_rollouts: bool
    max_staleness: int | None
    scoring_threads: int
    num_reward_workers: int
    reward_worker_cpus: float
    strategy: str
    # reward
    reward_weights: list | None
    reward_timeout: float
    reward_workers: int
    reward_isolation: bool | None
    # agent
    tools: list
    environment_factory: str | None
    max_tool_calling_iterations: int | None
    tool_parser: str
    tool_timeout: float
    tool_workers: int
    tool_isolation: str
