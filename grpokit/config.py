"""Configuration: nested dataclasses, YAML loading, command-line overrides, validation.

A config has sections (``model``, ``data``, ``algo``, ``generation``, ``optim``, ``run``, ``eval``,
``lora``, ``distributed``, ``reward``, ``agent``) plus a ``rewards`` list. Field names are unique across
sections, so a bare key (``num_generations=16``) names the one field of that name in whichever section
holds it; the seeds' aliases (``group_size``, ``kl_coef``, ``kl_beta``, ``clip_range``) are accepted too.

Defaults follow TRL's GRPOConfig where the concept exists there, except ``beta = 0.04`` and
``use_bias_correction_kl = False`` (plain k3, the formula of docs/architecture.md; TRL 1.16: True).
Every error is raised before any model is loaded, as a :class:`ConfigError` naming the problem
and the fix.
"""

from __future__ import annotations

import dataclasses
import difflib
import itertools
import math
import os
import types
import typing
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Union

import yaml

from grpokit import trl_compat
from grpokit.algos.names import ESTIMATORS, IMPORTANCE_SAMPLING_LEVELS, KL_CONTROLLERS, LOSS_TYPES, SCALE_REWARDS
from grpokit.algos.registry import ALGORITHMS

if TYPE_CHECKING:
    from grpokit.algos.losses import LossSpec


class ConfigError(ValueError):
    """A config problem, with a message that names the fix."""


@dataclass
class ModelConfig:
    model_name_or_path: str | None = None
    """Local folder or hub id of a causal LM (the `model` argument of GRPOTrainer overrides it)."""
    tokenizer_name_or_path: str | None = None
    """Tokenizer folder or hub id; defaults to the model's."""
    dtype: str = "auto"
    """auto (CUDA: bf16 weights where supported; CPU with native bf16: float32 weights + bf16 autocast; else float32) |
    float32 | bfloat16 | float16."""
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
class DataConfig:
    train_dataset: str | None = None
    """JSONL / Parquet / CSV path, a datasets folder, or `builtin:arithmetic`."""
    eval_dataset: str | None = None
    """Same forms as train_dataset; evaluation is skipped when empty."""
    prompt_column: str = "prompt"
    """Column holding the prompt: a string, or chat messages [{role, content}, ...]."""
    max_prompt_length: int | None = 512
    """Prompts longer than this many tokens are handled per `prompt_overflow`; null = no limit."""
    prompt_overflow: str = "truncate"
    """truncate (keep the last max_prompt_length tokens) | drop (skip the prompt) | error."""
    shuffle: bool = True
    """Shuffle the prompts each epoch (seeded)."""


@dataclass
class AlgoConfig:
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
    """Upper clip range (DAPO clip-higher); defaults to epsilon."""
    loss_type: str = "dapo"
    """Loss aggregation: grpo | bnpo | dr_grpo | dapo."""
    scale_rewards: str = "group"
    """Advantage scaling: group | batch | none (Dr. GRPO)."""
    advantage_estimator: str = "grpo"
    """grpo | rloo | reinforce_pp."""
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
class GenerationConfig:
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
    bad_words_ids, do_sample; other keys are refused by name (docs/from_trl.md)."""
    engine: str = "hf"
    """Rollout engine: hf (grpokit's own sampler, any device) | vllm (CUDA only, `pip install vllm`; colocated, sleeps
    while the learner trains)."""
    vllm_gpu_memory_utilization: float = 0.3
    """engine vllm: fraction of the GPU's memory vLLM may take for weights, activations and KV cache."""
    vllm_max_model_length: int | None = None
    """engine vllm: context length (prompt + completion); null = max_prompt_length + max_completion_length (the model's
    own without max_prompt_length)."""
    vllm_enable_sleep_mode: bool = True
    """engine vllm: free vLLM's KV cache and weights while the learner trains; weights are reloaded from the learner on
    each wake."""
    vllm_importance_sampling_correction: bool = True
    """engine vllm: weight each token's policy-gradient term by min(exp(logp_learner - logp_vllm), cap) (truncated
    importance sampling)."""
    vllm_importance_sampling_cap: float = 3.0
    """engine vllm: cap C of the truncated importance weight (>= 1)."""


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
    gradient_accumulation_steps: int = 1
    """Micro-batches per optimizer step; completions per optimizer step = this x per_device_train_batch_size x
    processes."""
    num_mini_batches: int = 1
    """Optimizer steps per generation batch (per num_iterations pass): a step samples this many optimizer steps'
    completions and cuts them in order into mini-batches, one optimizer step each (TRL: steps_per_generation = this
    x gradient_accumulation_steps)."""
    max_steps: int = 100
    """Steps to train (each: one generation batch, num_iterations x num_mini_batches optimizer steps); -1 =
    num_train_epochs over train_dataset."""
    num_train_epochs: float = 3.0
    """With max_steps -1: passes over train_dataset (steps = ceil(epochs x prompts // prompts per step), as TRL)."""
    seed: int = 42
    """Seed of data order, sampling and initialisation."""


@dataclass
class RunConfig:
    output_dir: str = "runs/grpo"
    """Run folder: config.yaml, metrics.jsonl, rollouts.sqlite, checkpoints/, report.html."""
    report_to: list = field(default_factory=lambda: ["console", "jsonl"])
    """Metric sinks: console, jsonl, tensorboard, wandb."""
    logging_steps: int = 1
    """Console logging interval (jsonl and the store get every step)."""
    save_strategy: str = "steps"
    """steps (every save_steps and at the end) | epoch (after each pass over train_dataset and at the end) | no (none,
    except on a signal)."""
    save_steps: int = 50
    """save_strategy steps: checkpoint every this many steps (and at the end); 0 = only at the end."""
    save_total_limit: int | None = 2
    """Keep at most this many step checkpoints; null = all."""
    resume_from: str | None = None
    """latest | a checkpoint folder; continues the same run exactly."""
    overwrite: bool = False
    """Allow reusing an output_dir that holds a run of a different config."""
    max_nonfinite_steps: int = 3
    """Stop after this many consecutive steps with a non-finite loss or gradient."""
    progress_bar: bool = True
    """Show a progress bar with live reward and KL (TRL's disable_tqdm=True sets it false)."""
    log_completions: bool = False
    """Print a table of prompts, completions and rewards every logging_steps (all are stored anyway)."""
    num_completions_to_print: int | None = None
    """Rows of that table; null = all of the step's completions."""


@dataclass
class EvalConfig:
    eval_strategy: str = "steps"
    """steps (every eval_steps) | epoch (after each pass over train_dataset) | no; evaluation also runs before and after
    training."""
    eval_steps: int = 0
    """eval_strategy steps: evaluate every this many steps (and before and after training when > 0); 0 = off."""
    num_generations_eval: int = 8
    """Samples per eval prompt (n of pass@k)."""
    pass_at_k: list = field(default_factory=lambda: [1, 8])
    """k values reported as eval/pass@k (k <= num_generations_eval; left at [1, 8] with num_generations_eval n < 8 it
    becomes [1, n])."""
    eval_temperature: float | None = None
    """Sampling temperature for evaluation; defaults to temperature."""
    max_eval_prompts: int | None = None
    """Evaluate on at most this many prompts."""
    success_threshold: float = 1.0
    """A sample counts as correct for pass@k when its combined reward >= this."""


@dataclass
class LoraConfig:
    r: int = 0
    """LoRA rank; 0 = full fine-tuning."""
    alpha: int = 16
    """LoRA scaling alpha."""
    dropout: float = 0.0
    """LoRA dropout."""
    target_modules: Any = "all-linear"
    """Module names (list) or all-linear."""
    merge_on_save: bool = False
    """Also save merged full weights at the end."""


@dataclass
class DistributedConfig:
    backend: str = "none"
    """none | ray."""
    address: str | None = None
    """Ray address (auto = an existing cluster); null starts a local one."""
    num_rollout_workers: int = 2
    """Ray rollout actors; the prompts of a step are split over them."""
    rollout_worker_cpus: float = 1.0
    """CPUs Ray reserves for each rollout actor."""
    rollout_worker_gpus: float = 0.0
    """GPUs Ray reserves for each rollout actor (> 0 samples on CUDA)."""
    ray_num_cpus: int | None = None
    """CPUs of the local Ray cluster grpokit starts when address is null; null = all."""
    seed_per_group: bool = False
    """Seed each group's sampler from (seed, step, group) so rollouts do not depend on how prompts are split; always on
    with Ray or several processes."""
    async_rollouts: bool = False
    """One-step-off (Ray): sample step k+1 while step k trains; ratios use the sampling log-probs."""
    num_reward_workers: int = 0
    """Ray reward actors (backend: ray); a batch is split over them by whole groups (under torchrun rank 0 scores every
    rank's rows). 0 = rewards run in the learner process."""
    reward_worker_cpus: float = 1.0
    """CPUs Ray reserves for each reward actor."""
    strategy: str = "ddp"
    """Data parallelism under torchrun: ddp (a whole policy per process) | fsdp (parameters, gradients and AdamW states
    sharded over processes)."""


@dataclass
class RewardSettings:
    reward_weights: list | None = None
    """Weights of the reward functions (one per function); default 1 each."""
    reward_timeout: float = 10.0
    """Seconds a reward function may take per batch before its values become None (its worker process is killed)."""
    reward_workers: int = 0
    """Worker processes per reward function, each scoring a chunk of whole groups (CPU-heavy rewards); 0 = one."""
    reward_isolation: bool = True
    """Run each reward function in a worker process that is killed at its timeout; false = threads in the trainer,
    where a timeout cannot stop code that holds the GIL."""


@dataclass
class AgentConfig:
    tools: list = field(default_factory=list)
    """Tool functions the model may call in multi-turn rollouts: `module:function` or `path/to/file.py:function`,
    each with type hints and a Google-style docstring (GRPOTrainer(tools=[...]) takes the functions themselves)."""
    environment_factory: str | None = None
    """`module:Class` or `path/to/file.py:Class`: called with no argument, one instance per rollout, reset with the
    dataset row; its public methods are tools and reward functions get the instances as `environments`."""
    max_tool_calling_iterations: int | None = None
    """Rounds of tool calls per rollout at most (TRL's name); null = until the model answers without a call or the
    completion budget (max_completion_length, tool results included) is spent."""
    tool_parser: str = "auto"
    """How tool calls are read: auto (from the chat template) | hermes | qwen3_xml | llama3 | mistral | a registered
    name | `module:function` / `file.py:function` (text -> list of grpokit.tools.ToolCall)."""
    tool_timeout: float = 30.0
    """Seconds one tool call may take; past it the call's worker is killed and the model reads an error."""
    tool_workers: int = 4
    """Tool calls of different rollouts running at once (worker processes for plain tools)."""
    tool_isolation: str = "process"
    """process (plain tools in killable worker processes) | thread (threads of the trainer); environment methods
    always run on threads of the trainer, where the reward functions read the instances."""


SECTIONS: dict[str, type] = {
    "model": ModelConfig,
    "data": DataConfig,
    "algo": AlgoConfig,
    "generation": GenerationConfig,
    "optim": OptimConfig,
    "run": RunConfig,
    "eval": EvalConfig,
    "lora": LoraConfig,
    "distributed": DistributedConfig,
    "reward": RewardSettings,
    "agent": AgentConfig,
}

ALIASES = {
    "group_size": "num_generations",
    "kl_coef": "beta",
    "kl_beta": "beta",
    "clip_range": "epsilon",
    "cliprange": "epsilon",
    "num_ppo_epochs": "num_iterations",
}

# The algorithms' option lists are defined in grpokit/algos/names.py, with the code that implements them.
CHOICES = {
    "dtype": ("auto", "float32", "bfloat16", "float16"),
    "ref_model_dtype": ("auto", "bfloat16"),
    "optimizer": trl_compat.OPTIMIZERS,
    "loss_type": LOSS_TYPES,
    "scale_rewards": SCALE_REWARDS,
    "advantage_estimator": ESTIMATORS,
    "importance_sampling_level": IMPORTANCE_SAMPLING_LEVELS,
    "kl_controller": KL_CONTROLLERS,
    "lr_scheduler_type": ("constant", "linear", "cosine"),
    "prompt_overflow": ("truncate", "drop", "error"),
    "backend": ("none", "ray"),
    "engine": ("hf", "vllm"),
    "strategy": ("ddp", "fsdp"),
    "save_strategy": ("steps", "epoch", "no"),
    "eval_strategy": ("steps", "epoch", "no"),
    "tool_isolation": ("process", "thread"),
}

REPORT_SINKS = ("console", "jsonl", "tensorboard", "wandb")

# field name -> section name; built once, field names are unique across sections.
FIELD_SECTION: dict[str, str] = {f.name: section for section, cls in SECTIONS.items() for f in dataclasses.fields(cls)}


def _field_docs(cls: type) -> dict[str, str]:
    """The docstring under each field (dataclass attribute docstrings) as one line, read from the source."""
    import ast
    import inspect

    tree = ast.parse(inspect.getsource(cls))
    body = tree.body[0].body
    docs = {}
    for prev, node in itertools.pairwise(body):
        if isinstance(prev, ast.AnnAssign) and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            docs[prev.target.id] = " ".join(str(node.value.value).split())
    return docs


class GRPOConfig:
    """The whole run configuration.

    Accepts sections (``GRPOConfig(algo={"beta": 0.0})``), bare field names
    (``GRPOConfig(num_generations=8, learning_rate=1e-5)``) and the seeds' aliases, in any mix.
    Reading ``cfg.num_generations`` returns the field from its section.

    Every key of TRL's GRPOConfig is accepted too (grpokit/trl_compat.py): those grpokit acts on map
    onto its fields (``bf16=True`` -> ``dtype: bfloat16``), the others are named in one warning and
    read back as given (``cfg.push_to_hub``).
    """

    def __init__(self, rewards: list | None = None, **kwargs: Any) -> None:
        values = _flatten(kwargs)
        grpokit_values, trl_given, unused = _from_trl(values, values)
        self._build(rewards, grpokit_values, trl_given, unused)
        if unused:
            warnings.warn(trl_compat.unused_message(unused), UserWarning, stacklevel=2)

    def _build(self, rewards: list | None, values: dict, trl_given: dict, unused: dict) -> None:
        for section, cls in SECTIONS.items():
            own = {k: v for k, v in values.items() if FIELD_SECTION[k] == section}
            object.__setattr__(self, section, cls(**{k: _coerce(cls, k, v) for k, v in own.items()}))
        object.__setattr__(self, "rewards", list(rewards or []))
        object.__setattr__(self, "trl_settings", dict(trl_given))  # TRL-only keys as given
        object.__setattr__(self, "unused_trl_settings", dict(unused))  # those grpokit does not act on
        self.validate()

    def __getattr__(self, name: str) -> Any:
        section = FIELD_SECTION.get(ALIASES.get(name, name))
        if section is None:
            if name in trl_compat.TRL_DEFAULTS and "trl_settings" in self.__dict__:
                return self.__dict__["trl_settings"].get(name, trl_compat.TRL_DEFAULTS[name])
            raise AttributeError(_unknown_key_message(name))
        return getattr(object.__getattribute__(self, section), ALIASES.get(name, name))

    def __setattr__(self, name: str, value: Any) -> None:
        key = ALIASES.get(name, name)
        section = FIELD_SECTION.get(key)
        if (
            section is None and key in trl_compat.TRL_DEFAULTS
        ):  # TRL-only: translated and validated as in the constructor
            new = self.replace(**{key: value})
            self.__dict__.update({k: getattr(new, k) for k in (*SECTIONS, "trl_settings", "unused_trl_settings")})
            return
        if section is None:
            raise ConfigError(_unknown_key_message(name))
        values, _, _ = _from_trl({key: value}, {**self._flat(), key: value})
        for (
            k,
            v,
        ) in values.items():  # a TRL form (report_to="none") becomes grpokit's value; TRL's None keeps the current one
            setattr(getattr(self, FIELD_SECTION[k]), k, _coerce(SECTIONS[FIELD_SECTION[k]], k, v))

    def _flat(self) -> dict:
        return {k: v for section in SECTIONS for k, v in dataclasses.asdict(getattr(self, section)).items()}

    def replace(self, **overrides: Any) -> GRPOConfig:
        """A copy with overrides applied (same key forms as the constructor), validated."""
        merged = self.to_dict()
        merged_flat = self._flat()
        given = _flatten({k: v for k, v in overrides.items() if k != "rewards"})
        values, trl_given, unused = _from_trl(given, {**merged_flat, **given})
        trl_given = {**self.trl_settings, **trl_given}
        unused = _from_trl(trl_given, {**merged_flat, **values})[2] if trl_given else {}
        new = object.__new__(GRPOConfig)
        new._build(overrides.get("rewards", merged["rewards"]), {**merged_flat, **values}, trl_given, unused)
        before = self.unused_trl_settings
        fresh = {k: v for k, v in unused.items() if k not in before or v != before[k]}
        if fresh:
            warnings.warn(trl_compat.unused_message(fresh), UserWarning, stacklevel=2)
        return new

    def to_dict(self) -> dict:
        out = {section: dataclasses.asdict(getattr(self, section)) for section in SECTIONS}
        out["rewards"] = [r if isinstance(r, (str, dict)) else _callable_name(r) for r in self.rewards]
        return out

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)

    def __repr__(self) -> str:
        return f"GRPOConfig({self.to_dict()!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, GRPOConfig) and self.to_dict() == other.to_dict()

    # ---- derived sizes -------------------------------------------------------------------
    def completions_per_step(self, world_size: int = 1) -> int:
        """Completions sampled per step (the generation batch): num_mini_batches optimizer steps' worth."""
        return self.per_device_train_batch_size * self.gradient_accumulation_steps * self.num_mini_batches * world_size

    def optimizer_steps_per_step(self) -> int:
        return self.num_iterations * self.num_mini_batches

    def prompts_per_step(self, world_size: int = 1) -> int:
        return self.completions_per_step(world_size) // self.num_generations

    def sampling_options(self) -> dict:
        """How completions are sampled besides their length and temperature (``SamplingParams`` fields): top_p,
        top_k, min_p, repetition_penalty, and what ``generation_kwargs`` adds or overrides (TRL's forms,
        ``trl_compat.generation_options``)."""
        g = self.generation
        try:
            return trl_compat.generation_options(
                g.temperature,
                g.max_completion_length,
                g.top_p,
                g.top_k,
                g.min_p,
                g.repetition_penalty,
                g.generation_kwargs,
                g.engine,
            )
        except trl_compat.TRLValueError as exc:
            raise ConfigError(str(exc)) from None

    def loss_spec(self) -> LossSpec:
        """The settings of ``algos.policy_loss`` for this run, built once by the learner."""
        from grpokit.algos.losses import LossSpec  # torch: only for training

        return LossSpec(
            loss_type=self.loss_type,
            epsilon=self.epsilon,
            epsilon_high=self.epsilon_high,
            beta=0.0 if self.kl_in_reward else self.beta,  # kl_in_reward: beta weighs the KL in the rewards
            use_bias_correction_kl=self.use_bias_correction_kl,
            importance_sampling_level=self.importance_sampling_level,
            max_completion_length=self.max_completion_length,
            sampling_cap=self.vllm_importance_sampling_cap,
        )

    # ---- validation ----------------------------------------------------------------------
    def validate(self, world_size: int = 1) -> None:
        """Reject impossible values with one message each; no model is touched."""
        a, g, o, e, r = self.algo, self.generation, self.optim, self.eval, self.run
        for name, choices in CHOICES.items():
            value = getattr(self, name)
            if value not in choices:
                close = difflib.get_close_matches(str(value), choices, n=1)
                hint = f" Did you mean {close[0]!r}?" if close else ""
                raise ConfigError(f"{name}={value!r} is not valid; choose one of {', '.join(choices)}.{hint}")
        self._validate_algorithm(world_size)
        _check(a.epsilon > 0, f"epsilon={a.epsilon} must be > 0 (the clip range, e.g. 0.2).")
        _check(a.epsilon_high is None or a.epsilon_high > 0, f"epsilon_high={a.epsilon_high} must be > 0 or null.")
        _check(a.beta >= 0, f"beta={a.beta} must be >= 0 (0 disables the KL penalty).")
        _check(a.num_iterations >= 1, f"num_iterations={a.num_iterations} must be >= 1.")
        _check(
            0.0 <= a.ref_model_mixup_alpha <= 1.0, f"ref_model_mixup_alpha={a.ref_model_mixup_alpha} must be in [0, 1]."
        )
        _check(a.ref_model_sync_steps >= 0, f"ref_model_sync_steps={a.ref_model_sync_steps} must be >= 0 (0 = never).")
        _check(a.max_kl is None or a.max_kl > 0, f"max_kl={a.max_kl} must be > 0 or null.")
        _check(a.max_kl_patience >= 1, f"max_kl_patience={a.max_kl_patience} must be >= 1.")
        self._validate_kl_control_and_dynamic_sampling(world_size)
        _check(g.max_completion_length >= 1, f"max_completion_length={g.max_completion_length} must be >= 1.")
        _check(
            g.temperature > 0,
            f"temperature={g.temperature} must be > 0 (use a small value such as 0.1 for near-greedy sampling).",
        )
        _check(0 < g.top_p <= 1, f"top_p={g.top_p} must be in (0, 1].")
        _check(g.top_k >= 0, f"top_k={g.top_k} must be >= 0 (0 = off).")
        _check(0 <= g.min_p < 1, f"min_p={g.min_p} must be in [0, 1) (0 = off).")
        _check(g.repetition_penalty > 0, f"repetition_penalty={g.repetition_penalty} must be > 0 (1 = off).")
        sampling = self.sampling_options()  # generation_kwargs' keys, checked; their values in range too
        for key in ("top_p", "top_k", "min_p", "repetition_penalty"):
            if g.generation_kwargs and key in g.generation_kwargs:
                value = sampling[key]
                ok = {"top_p": 0 < value <= 1, "top_k": value >= 0, "min_p": 0 <= value < 1}.get(key, value > 0)
                _check(ok, f"generation_kwargs {key}={value!r} is out of range (as the config key {key}).")
        _check(o.learning_rate >= 0, f"learning_rate={o.learning_rate} must be >= 0.")
        _check(
            o.max_steps >= 1 or o.max_steps == -1,
            f"max_steps={o.max_steps} must be >= 1, or -1 to train num_train_epochs.",
        )
        _check(o.num_train_epochs > 0, f"num_train_epochs={o.num_train_epochs} must be > 0.")
        _check(o.adam_epsilon > 0, f"adam_epsilon={o.adam_epsilon} must be > 0.")
        _check(
            o.per_device_train_batch_size >= 1,
            f"per_device_train_batch_size={o.per_device_train_batch_size} must be >= 1.",
        )
        _check(
            o.gradient_accumulation_steps >= 1,
            f"gradient_accumulation_steps={o.gradient_accumulation_steps} must be >= 1.",
        )
        _check(0 <= o.warmup_ratio < 1, f"warmup_ratio={o.warmup_ratio} must be in [0, 1).")
        _check(o.warmup_steps >= 0, f"warmup_steps={o.warmup_steps} must be >= 0.")
        _check(o.max_grad_norm >= 0, f"max_grad_norm={o.max_grad_norm} must be >= 0 (0 = no clipping).")
        _check(o.weight_decay >= 0, f"weight_decay={o.weight_decay} must be >= 0.")
        for beta_name in ("adam_beta1", "adam_beta2"):
            _check(
                0 <= getattr(o, beta_name) < 1,
                f"{beta_name}={getattr(o, beta_name)} must be in [0, 1) (AdamW's moving-average rate, e.g. 0.9).",
            )
        _check(0 <= o.seed < 2**63, f"seed={o.seed} must be in [0, 2**63).")
        _check(o.num_mini_batches >= 1, f"num_mini_batches={o.num_mini_batches} must be >= 1.")
        n = self.completions_per_step(world_size)
        mini = f" x num_mini_batches ({o.num_mini_batches})" if o.num_mini_batches > 1 else ""
        _check(
            n % a.num_generations == 0,
            f"completions per step = per_device_train_batch_size ({o.per_device_train_batch_size}) x "
            f"gradient_accumulation_steps ({o.gradient_accumulation_steps}){mini} x processes ({world_size}) = {n} "
            f"is not divisible by num_generations ({a.num_generations}); make it a multiple of {a.num_generations}.",
        )
        _check(
            self.data.max_prompt_length is None or self.data.max_prompt_length >= 1,
            f"max_prompt_length={self.data.max_prompt_length} must be >= 1 or null.",
        )
        _check(e.eval_steps >= 0, f"eval_steps={e.eval_steps} must be >= 0 (0 = off).")
        _check(e.num_generations_eval >= 1, f"num_generations_eval={e.num_generations_eval} must be >= 1.")
        _check(
            e.eval_temperature is None or e.eval_temperature > 0,
            f"eval_temperature={e.eval_temperature} must be > 0 or null (= temperature).",
        )
        _check(
            e.max_eval_prompts is None or e.max_eval_prompts >= 1,
            f"max_eval_prompts={e.max_eval_prompts} must be >= 1 or null (= all).",
        )
        for k in e.pass_at_k:
            _check(
                isinstance(k, int) and 1 <= k <= e.num_generations_eval,
                f"pass_at_k contains {k!r}: each k must be an integer in [1, "
                f"num_generations_eval={e.num_generations_eval}].",
            )
        _check(r.save_steps >= 0, f"save_steps={r.save_steps} must be >= 0 (0 = only at the end).")
        _check(
            r.save_total_limit is None or r.save_total_limit >= 1,
            f"save_total_limit={r.save_total_limit} must be >= 1 or null.",
        )
        _check(r.max_nonfinite_steps >= 1, f"max_nonfinite_steps={r.max_nonfinite_steps} must be >= 1.")
        _check(r.logging_steps >= 1, f"logging_steps={r.logging_steps} must be >= 1.")
        _check(
            r.num_completions_to_print is None or r.num_completions_to_print >= 1,
            f"num_completions_to_print={r.num_completions_to_print} must be >= 1 or null (= all).",
        )
        for sink in r.report_to:
            _check(sink in REPORT_SINKS, f"report_to contains {sink!r}; valid sinks are {', '.join(REPORT_SINKS)}.")
        _check(self.lora.r >= 0, f"lora.r={self.lora.r} must be >= 0 (0 = no LoRA).")
        _check(
            self.lora.r == 0 or a.ref_model_sync_steps == 0,
            f"ref_model_sync_steps={a.ref_model_sync_steps} cannot be used with LoRA: the reference is the base model "
            "under the adapters, which never changes; set ref_model_sync_steps: 0.",
        )
        _check(
            not self.model.load_in_4bit or self.lora.r > 0,
            "load_in_4bit: true trains LoRA adapters on frozen 4-bit weights (QLoRA); set lora.r > 0 (e.g. lora.r: "
            "16).",
        )
        if self.model.ref_model_dtype == "bfloat16":
            _check(
                self.lora.r == 0,
                "ref_model_dtype: bfloat16 stores the reference copy in bf16, but with LoRA there is no copy (the "
                "reference is the base under the adapters); set ref_model_dtype: auto.",
            )
            _check(
                a.ref_model_sync_steps == 0,
                "ref_model_dtype: bfloat16 cannot be used with ref_model_sync_steps: the resync's small mix-ups "
                "would be lost to bf16 rounding; set ref_model_dtype: auto or ref_model_sync_steps: 0.",
            )
        _check(self.lora.alpha > 0, f"lora.alpha={self.lora.alpha} must be > 0.")
        _check(0 <= self.lora.dropout < 1, f"lora.dropout={self.lora.dropout} must be in [0, 1).")
        _check(
            self.reward.reward_workers >= 0,
            f"reward_workers={self.reward.reward_workers} must be >= 0 (0 = one process per function).",
        )
        weights = self.reward.reward_weights
        for w in weights or []:
            _check(
                isinstance(w, (int, float)) and not isinstance(w, bool) and math.isfinite(w),
                f"reward_weights contains {w!r}; each weight must be a finite number.",
            )
        if weights is not None and self.rewards:
            _check(
                len(weights) == len(self.rewards),
                f"reward_weights has {len(weights)} values but there are {len(self.rewards)} reward functions; give "
                "one weight per function.",
            )
        d = self.distributed
        _check(d.num_rollout_workers >= 1, f"num_rollout_workers={d.num_rollout_workers} must be >= 1.")
        _check(
            d.rollout_worker_cpus >= 0 and d.rollout_worker_gpus >= 0,
            "rollout_worker_cpus and rollout_worker_gpus must be >= 0.",
        )
        _check(
            not d.async_rollouts or d.backend == "ray",
            "async_rollouts needs backend: ray (rollouts are sampled by Ray workers while the learner trains).",
        )
        _check(
            d.num_reward_workers >= 0,
            f"num_reward_workers={d.num_reward_workers} must be >= 0 (0 = rewards in the learner process).",
        )
        _check(d.reward_worker_cpus >= 0, f"reward_worker_cpus={d.reward_worker_cpus} must be >= 0.")
        _check(
            d.num_reward_workers == 0 or d.backend == "ray",
            f"num_reward_workers={d.num_reward_workers} needs backend: ray (Ray reward actors); "
            "without Ray use reward.reward_workers for worker processes of the learner.",
        )
        if d.backend == "ray" and d.address is None and d.ray_num_cpus is not None:
            wanted = d.num_rollout_workers * d.rollout_worker_cpus + d.num_reward_workers * d.reward_worker_cpus
            _check(
                wanted <= d.ray_num_cpus,
                f"the Ray actors reserve {wanted:g} CPUs (num_rollout_workers x rollout_worker_cpus + "
                f"num_reward_workers x reward_worker_cpus) but the local cluster has ray_num_cpus={d.ray_num_cpus}, so "
                "some would never start; "
                "lower the workers or their CPUs, or raise ray_num_cpus.",
            )
        _check(
            d.num_reward_workers == 0 or self.reward.reward_workers == 0,
            f"num_reward_workers={d.num_reward_workers} (Ray actors) and reward_workers="
            f"{self.reward.reward_workers} (worker processes of the learner) are two places to run the rewards; set "
            "one of them to 0.",
        )
        if g.engine == "vllm":
            self._validate_vllm()
        _check(
            d.strategy != "fsdp" or self.lora.r == 0,
            "strategy: fsdp shards full fine-tuning; LoRA trains small adapters (lora.r > 0), which "
            "need no sharding: set strategy: ddp, or lora.r: 0 to fine-tune every weight with FSDP.",
        )
        _check(
            d.strategy != "fsdp"
            or (self.optim.optimizer not in trl_compat.EIGHT_BIT_OPTIMIZERS and self.model.ref_model_dtype == "auto"),
            "strategy: fsdp shards the weights and AdamW's state already; the 8-bit optimizer and ref_model_dtype: "
            "bfloat16 are for one process's memory: set optimizer: adamw_torch_fused and ref_model_dtype: auto, or "
            "strategy: ddp.",
        )
        _check(self.reward.reward_timeout > 0, f"reward_timeout={self.reward.reward_timeout} must be > 0 seconds.")
        self._validate_agent()

    def _validate_agent(self) -> None:
        """The agent section's values, and the settings multi-turn rollouts cannot run with."""
        t = self.agent
        for spec in t.tools:
            _check(
                isinstance(spec, str) and ":" in spec,
                f"tools contains {spec!r}; each entry is 'module:function' or 'path/to/file.py:function' (pass "
                "functions themselves as GRPOTrainer(tools=[...])).",
            )
        _check(
            t.environment_factory is None or ":" in t.environment_factory,
            f"environment_factory={t.environment_factory!r}: give 'module:Class' or 'path/to/file.py:Class'.",
        )
        _check(
            t.max_tool_calling_iterations is None or t.max_tool_calling_iterations >= 0,
            f"max_tool_calling_iterations={t.max_tool_calling_iterations} must be >= 0 or null (no limit).",
        )
        _check(t.tool_timeout > 0, f"tool_timeout={t.tool_timeout} must be > 0 seconds.")
        _check(t.tool_workers >= 1, f"tool_workers={t.tool_workers} must be >= 1.")
        if t.tools or t.environment_factory:
            self.check_multi_turn()

    def check_multi_turn(self) -> None:
        """Refuse the settings multi-turn tool rollouts cannot run with (tools from the config or from
        GRPOTrainer(tools=..., environment_factory=...))."""
        fix = "multi-turn tool rollouts are sampled by the hf engine in the training process"
        _check(self.engine == "hf", f"tools and environments need generation.engine: hf ({fix}).")
        _check(self.backend == "none", f"tools and environments need distributed.backend: none ({fix}).")

    def _validate_kl_control_and_dynamic_sampling(self, world_size: int) -> None:
        a = self.algo
        _check(a.kl_horizon > 0, f"kl_horizon={a.kl_horizon} must be > 0 (e.g. 10000).")
        if a.kl_controller == "adaptive":
            _check(
                a.target_kl is not None and a.target_kl > 0,
                f"kl_controller: adaptive needs target_kl > 0 (the KL to steer towards, e.g. 0.1), got {a.target_kl}.",
            )
            _check(
                a.beta > 0,
                "kl_controller: adaptive multiplies beta each step, so beta=0 would stay 0; start it above 0 "
                "(e.g. beta: 0.04).",
            )
            n = self.completions_per_step(world_size)
            _check(
                a.kl_horizon > 0.2 * n,
                f"kl_horizon={a.kl_horizon} must be above 0.2 x completions per step ({n}) = {0.2 * n:g}, or one step "
                "could take beta to 0 or below; raise it (e.g. 10000).",
            )
        else:
            _check(
                a.target_kl is None,
                f"target_kl={a.target_kl} is used by the adaptive KL controller only; set kl_controller: adaptive, or "
                "remove target_kl for a fixed beta.",
            )
        _check(a.max_sampling_rounds >= 1, f"max_sampling_rounds={a.max_sampling_rounds} must be >= 1.")
        if not a.dynamic_sampling:
            return
        _check(
            a.num_generations >= 2,
            f"dynamic_sampling keeps the groups whose rewards differ, and a group of num_generations="
            f"{a.num_generations} never differs; set num_generations >= 2, or turn dynamic_sampling off.",
        )
        _check(
            not self.distributed.async_rollouts,
            "dynamic_sampling samples more prompts within a step, which async_rollouts (the next step sampled "
            "ahead) cannot; set async_rollouts: false (Ray rollout workers still sample each round), or turn "
            "dynamic_sampling off.",
        )
        _check(
            world_size == 1,
            f"dynamic_sampling runs in one process; under torchrun ({world_size} processes) the informative groups "
            "would land unevenly on the ranks. Run one process (backend: ray spreads the sampling over workers), or "
            "turn dynamic_sampling off.",
        )

    def _validate_algorithm(self, world_size: int) -> None:
        """``algorithm`` by name (``algos/registry.py``) and the options of the chosen one."""
        a = self.algo
        if a.algorithm not in ALGORITHMS:
            close = difflib.get_close_matches(str(a.algorithm), ALGORITHMS, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ConfigError(f"algorithm={a.algorithm!r} is not valid; choose one of {', '.join(ALGORITHMS)}.{hint}")
        algorithm = ALGORITHMS[a.algorithm]
        _check(
            a.num_generations >= algorithm.min_generations,
            f"num_generations={a.num_generations}: GRPO needs at least 2 completions per prompt to compare them; set "
            "num_generations >= 2 (or algorithm: ppo, whose learned value needs no group)."
            if a.algorithm == "grpo"
            else f"num_generations={a.num_generations} must be >= {algorithm.min_generations}.",
        )
        _check(
            not a.kl_in_reward or a.algorithm == "ppo",
            f"kl_in_reward: true folds the KL into per-token rewards, which algorithm: {a.algorithm} has none of; "
            "use algorithm: ppo, or kl_in_reward: false (the KL term in the loss).",
        )
        if a.algorithm != "ppo":
            return
        _check(0 <= a.gamma <= 1, f"gamma={a.gamma} must be in [0, 1] (GAE's discount; 1 = none).")
        _check(0 <= a.lam <= 1, f"lam={a.lam} must be in [0, 1] (GAE's lambda).")
        _check(a.vf_coef > 0, f"vf_coef={a.vf_coef} must be > 0 (the value loss's weight).")
        _check(a.cliprange_value > 0, f"cliprange_value={a.cliprange_value} must be > 0 (e.g. 0.2).")
        _check(
            a.critic_learning_rate is None or a.critic_learning_rate >= 0,
            f"critic_learning_rate={a.critic_learning_rate} must be >= 0 or null (= learning_rate).",
        )
        _check(
            a.importance_sampling_level == "token",
            "algorithm: ppo gives every token its own advantage, which a sequence-level ratio "
            "(importance_sampling_level: sequence, GSPO) cannot use; set importance_sampling_level: token.",
        )
        _check(
            world_size == 1,
            f"algorithm: ppo trains its critic in one process; this run has {world_size} (torchrun): run it as one "
            "process, or use algorithm: grpo.",
        )

    def _validate_vllm(self) -> None:
        """Settings engine: vllm cannot run with (the CUDA and package checks are the trainer's, at start)."""
        g = self.generation
        fix = "or set generation.engine: hf"
        _check(
            self.distributed.backend == "none",
            "generation.engine: vllm samples in the learner process; it cannot be combined with distributed.backend: "
            f"{self.distributed.backend} (set backend: none, {fix}).",
        )
        _check(
            self.model.device == "auto" or self.model.device.startswith("cuda"),
            f"generation.engine: vllm runs on CUDA, but model.device={self.model.device!r}; set device: auto or cuda, "
            f"{fix}.",
        )
        _check(
            not self.model.load_in_4bit,
            f"generation.engine: vllm cannot load the learner's 4-bit (QLoRA) weights; set load_in_4bit: false, {fix}.",
        )
        _check(
            g.temperature <= 2.0, f"temperature={g.temperature}: vLLM samples at temperatures up to 2; lower it, {fix}."
        )
        _check(
            0 < g.vllm_gpu_memory_utilization <= 1,
            f"vllm_gpu_memory_utilization={g.vllm_gpu_memory_utilization} must be in (0, 1] (a fraction of the GPU's "
            "memory, e.g. 0.3).",
        )
        _check(
            g.vllm_max_model_length is None or g.vllm_max_model_length > g.max_completion_length,
            f"vllm_max_model_length={g.vllm_max_model_length} leaves no room for a prompt: it must exceed "
            f"max_completion_length={g.max_completion_length} (or be null).",
        )
        _check(
            g.vllm_importance_sampling_cap >= 1,
            f"vllm_importance_sampling_cap={g.vllm_importance_sampling_cap} must be >= 1 (weights are truncated at it; "
            "1 never up-weights a token).",
        )


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def _callable_name(fn: Any) -> str:
    return f"{getattr(fn, '__module__', '?')}:{getattr(fn, '__qualname__', type(fn).__name__)}"


def _from_trl(given: dict, context: dict) -> tuple[dict, dict, dict]:
    try:
        return trl_compat.from_trl(given, context, set(FIELD_SECTION))
    except trl_compat.TRLValueError as exc:
        raise ConfigError(str(exc)) from None


def _unknown_key_message(key: str) -> str:
    candidates = (
        list(FIELD_SECTION)
        + list(ALIASES)
        + [f"{s}.{k}" for k, s in FIELD_SECTION.items()]
        + list(SECTIONS)
        + ["rewards"]
        + list(trl_compat.TRL_DEFAULTS)
    )
    close = difflib.get_close_matches(key, candidates, n=1, cutoff=0.6)
    hint = f" Did you mean {close[0]!r}?" if close else " Run `grpokit explain CONFIG` to see every key."
    return f"unknown config key {key!r}.{hint}"


def _field_in_section(section: str, key: str) -> str:
    """The field named by ``section.key``; a field put under the wrong section is named with its own."""
    name = ALIASES.get(key, key)
    home = FIELD_SECTION.get(name)
    if home == section:
        return name
    if home is not None:
        raise ConfigError(
            f"{key!r} is not a key of section {section!r}: it belongs to {home!r}; move it under `{home}:` (or write "
            "it at the top level)."
        )
    raise ConfigError(_unknown_key_message(f"{section}.{key}"))


def _flatten(values: dict) -> dict:
    """Map sections, dotted keys, bare keys and aliases to {field_name: value}."""
    flat: dict[str, Any] = {}
    for key, value in values.items():
        key = str(key).lstrip("-").replace("-", "_")
        if key in SECTIONS and key in trl_compat.TRL_DEFAULTS and not isinstance(value, dict):
            flat[key] = value  # TRL's `optim` (the optimizer's name), not grpokit's section
            continue
        if key in SECTIONS:
            if value is None:
                continue
            if not isinstance(value, dict):
                raise ConfigError(f"section {key!r} must be a mapping of keys to values, got {type(value).__name__}.")
            for sub, v in value.items():
                flat[_field_in_section(key, str(sub))] = v
            continue
        if "." in key:
            section, _, sub = key.partition(".")
            if section not in SECTIONS:
                raise ConfigError(_unknown_key_message(key))
            flat[_field_in_section(section, sub)] = value
            continue
        name = ALIASES.get(key, key)
        if name not in FIELD_SECTION and name not in trl_compat.TRL_DEFAULTS:
            raise ConfigError(_unknown_key_message(key))
        flat[name] = value
    return flat


# Fields holding a filesystem path (or a hub id / keyword, which expansion leaves alone). Reward files
# (`path/to/file.py:function`) are expanded where they are loaded (rewards/registry.py), with expand_path.
PATH_FIELDS = (
    "model_name_or_path",
    "tokenizer_name_or_path",
    "value_model_name_or_path",
    "train_dataset",
    "eval_dataset",
    "output_dir",
    "resume_from",
)


def expand_path(path: str) -> str:
    """``~`` and environment variables (``$VAR``, ``${VAR}``) expanded, as a shell would; other text unchanged."""
    return os.path.expanduser(os.path.expandvars(path))


def _coerce(cls: type, name: str, value: Any) -> Any:
    """Check a value against the field's annotation; accept ints for floats and strings from the CLI."""
    hints = typing.get_type_hints(cls)
    expected = hints[name]
    optional = False
    origin = typing.get_origin(expected)
    if origin in (Union, types.UnionType):
        args = [t for t in typing.get_args(expected) if t is not type(None)]
        optional = len(args) < len(typing.get_args(expected))
        expected = args[0]
    if value is None:
        if optional or expected is Any:
            return None
        raise ConfigError(f"{name} cannot be null; give a {expected.__name__}{_example(cls, name)}.")
    if expected is Any:
        return value
    if isinstance(value, str) and expected is not str:
        value = _parse_scalar(value)
        if value is None and optional:
            return None
    if expected is bool:
        if isinstance(value, bool):
            return value
    elif expected is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
    elif expected is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            try:
                number = float(value)
            except OverflowError:  # an int beyond the float range
                number = math.inf
            if not math.isfinite(number):
                raise ConfigError(f"{name}={value!r} must be a finite number{_example(cls, name)}.")
            return number
    elif expected is str:
        if isinstance(value, str):
            return expand_path(value) if name in PATH_FIELDS else value
    elif expected is list:
        if isinstance(value, (list, tuple)):
            return list(value)
        if isinstance(value, (str, int)):
            return [value]
    elif expected is dict and isinstance(value, dict):
        return dict(value)
    hint = ""
    if isinstance(value, dict) and value and all(key in FIELD_SECTION for key in value):
        sections = sorted({FIELD_SECTION[key] for key in value})  # a section's settings under a setting's name
        hint = f" Settings like {', '.join(value)} go in the section {' / '.join(sections)}: write them under it."
    raise ConfigError(
        f"{name}={value!r} has the wrong type: expected {expected.__name__}, got "
        f"{type(value).__name__}{_example(cls, name)}.{hint}"
    )


def _example(cls: type, name: str) -> str:
    """' (for example name: <default>)', showing the expected form; empty for a null default."""
    f = next(f for f in dataclasses.fields(cls) if f.name == name)
    default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
    if default is None:
        return ""
    shown = yaml.safe_dump(default, default_flow_style=True).strip().removesuffix("...").strip()
    return f" (for example {name}: {shown})"


def _parse_scalar(text: str) -> Any:
    """Parse a CLI value with YAML rules (1e-5 -> float, true -> bool, [1,8] -> list, null -> None)."""
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        return text
    if isinstance(value, str):
        try:
            return float(value)  # YAML 1.1 reads "1e-5" as a string
        except ValueError:
            return value
    return value


def parse_overrides(args: list[str]) -> dict:
    """Turn ``key=value``, ``section.key=value``, ``--key=value`` / ``--key value`` and a bare ``--flag`` (= true) into
    a dict."""
    out: dict[str, Any] = {}
    i = 0
    while i < len(args):
        arg = args[i]
        if "=" in arg:
            key, _, value = arg.partition("=")
        elif arg.startswith("--") and i + 1 < len(args) and not args[i + 1].startswith("--") and "=" not in args[i + 1]:
            key, value = arg, args[i + 1]
            i += 1
        elif arg.startswith("--"):
            key, value = arg, "true"  # a bare flag such as --overwrite
        else:
            raise ConfigError(f"cannot read override {arg!r}: write key=value, section.key=value or --key=value.")
        out[key.lstrip("-")] = _cli_value(key, value)
        i += 1
    return out


def _cli_value(key: str, text: str) -> Any:
    """A command-line value: parsed with YAML rules, except for a string field, whose text is kept as
    written (``output_dir=007`` stays '007'); there only null or ~ mean None, for an optional field."""
    name = key.lstrip("-").replace("-", "_").rpartition(".")[2]
    name = ALIASES.get(name, name)
    section = FIELD_SECTION.get(name)
    if section is None:
        return _parse_scalar(text)
    hint = typing.get_type_hints(SECTIONS[section])[name]
    if hint is str:
        return text
    if hint == str | None:
        return None if text in ("null", "~") else text
    return _parse_scalar(text)


def load_config(path: str | Path | None = None, overrides: list[str] | dict | None = None) -> GRPOConfig:
    """Load a YAML config, apply overrides, validate. Errors name the file and the key."""
    data: dict[str, Any] = {}
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(
                f"config file {str(path)!r} does not exist; pass the path of a YAML file (see examples/)."
            )
        try:
            data = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
            raise ConfigError(f"{path}: not valid YAML{where}: {getattr(exc, 'problem', None) or exc}") from None
        if not isinstance(data, dict):
            raise ConfigError(
                f"{path}: the top level must be a mapping of sections (model:, data:, algo:, ...), got "
                f"{type(data).__name__}."
            )
    if isinstance(overrides, list):
        overrides = parse_overrides(overrides)
    rewards = data.pop("rewards", None)
    values = _flatten(data)
    overrides = dict(overrides or {})
    if "rewards" in overrides:
        rewards = overrides.pop("rewards")
    values.update(_flatten(overrides))
    if rewards is not None and not isinstance(rewards, list):
        rewards = [rewards]
    return GRPOConfig(rewards=rewards, **values)


def config_reference() -> str:
    """Markdown reference of every field, generated from the dataclasses and their docstrings."""
    lines = []
    for section, cls in SECTIONS.items():
        lines += [f"### `{section}`", "", "| key | default | meaning |", "|---|---|---|"]
        docs = _field_docs(cls)
        for f in dataclasses.fields(cls):
            default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
            lines.append(f"| `{f.name}` | `{default!r}` | {docs.get(f.name, '').replace('|', chr(92) + '|')} |")
        lines.append("")
    lines += [
        "### `rewards`",
        "",
        "A list; each entry is a built-in name, `module:function`, `path/to/file.py:function`, or a mapping "
        "`{name: ..., weight: ..., <params>}`.",
        "",
        "Aliases: " + ", ".join(f"`{k}` = `{v}`" for k, v in ALIASES.items()) + ".",
        "",
        f"Every key of TRL {trl_compat.TRL_VERSION}'s `GRPOConfig` is accepted as well (`bf16`, `save_strategy`, "
        '`report_to="none"` ...): [from_trl.md](from_trl.md) lists how each maps onto the keys above.',
    ]
    return "\n".join(lines)
