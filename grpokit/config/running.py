"""The run sections of the config: run folder, evaluation, LoRA, distributed, rewards, agent (tools)."""

from __future__ import annotations

from dataclasses import dataclass, field

from grpokit.store.settings import StoreSettings


@dataclass
class RunConfig(StoreSettings):  # store_token_values: the rollout store's own settings
    output_dir: str = "runs/grpo"
    """Run folder: config.yaml, metrics.jsonl, rollouts.sqlite, checkpoints/, report.html."""
    report_to: list = field(default_factory=lambda: ["console", "jsonl"])
    """Metric sinks: console, jsonl, tensorboard, wandb, mlflow, trackio (the last two: optional extras)."""
    logging_steps: int = 10
    """Console line and log_history entry every this many steps, as TRL (jsonl and the store get every step)."""
    save_strategy: str = "steps"
    """steps (every save_steps and at the end) | epoch (after each pass over train_dataset and at the end) | no (none,
    except on a signal)."""
    save_steps: int = 50
    """save_strategy steps: checkpoint every this many steps (and at the end); 0 = only at the end."""
    save_total_limit: int | None = 2
    """Keep at most this many step checkpoints; null = all."""
    resume_from: str | None = None
    """latest (the newest intact checkpoint) | a checkpoint folder; continues the same run exactly."""
    overwrite: bool = False
    """Replace a run in output_dir: its config.yaml, rollouts.sqlite, metrics.jsonl, report.html, checkpoints/,
    final/ and tensorboard/ are moved to output_dir/.overwritten, deleted once the new run has its first checkpoint
    (or final model), and put back if it stops before."""
    max_nonfinite_steps: int = 3
    """Stop after this many consecutive steps with a non-finite loss or gradient."""
    warn_tied_steps: int = 10
    """Warn when every group's completions tie (one reward per group: no advantage, nothing learned) this many steps
    in a row, naming the reward functions and their values; 0 = never."""
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
    """One-step-off (Ray): sample step k+1 while step k trains; ratios use the sampling log-probs. Same as
    max_staleness: 1."""
    max_staleness: int | None = None
    """K: producers sample up to K steps ahead, so every sample trained at policy version v was sampled by version
    >= v - K (admission: they wait, nothing is dropped); 0 = synchronous; null = 1 with async_rollouts, else 0. Ray
    rollout workers, or (backend none, one process) a background thread: on a copy of the policy (engine hf), or driving
    a vLLM server (vllm_mode: server)."""
    scoring_threads: int = 1
    """max_staleness >= 1: batches scored at once on the producers' side (a slow or remote reward overlaps the next
    batches); > 1 needs rewards that may be called concurrently: reward_isolation: false (threads), no worker
    processes."""
    num_reward_workers: int = 0
    """Ray reward actors (backend: ray); a batch is split over them by whole groups (under torchrun rank 0 scores every
    rank's rows). 0 = rewards run in the learner process."""
    reward_worker_cpus: float = 1.0
    """CPUs Ray reserves for each reward actor."""
    strategy: str = "ddp"
    """Data parallelism under torchrun: ddp (a whole policy per process) | fsdp (parameters, gradients and AdamW states
    sharded over processes)."""

    def staleness_bound(self) -> int:
        """K, the resolved max_staleness: as set, else 1 with async_rollouts and 0 without."""
        if self.max_staleness is not None:
            return self.max_staleness
        return 1 if self.async_rollouts else 0


@dataclass
class RewardSettings:
    reward_weights: list | None = None
    """Weights of the reward functions (one per function); default 1 each."""
    reward_timeout: float = 10.0
    """Seconds a reward function may take per batch before its values become None (its worker process is killed)."""
    reward_workers: int = 0
    """Worker processes per reward function, each scoring a chunk of whole groups (CPU-heavy rewards); 0 = one."""
    reward_isolation: bool | None = None
    """true: each reward function in a worker process, killed at its timeout; false: threads in the trainer, where a
    timeout cannot stop code that holds the GIL; null: rewards named by a string (built-ins, module:function,
    file.py:function) in worker processes, functions passed from Python in the trainer's process (as TRL)."""


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
