"""Several processes' settings: Ray rollout and reward workers, sampling ahead, and torchrun's data parallelism
(:mod:`grpokit.distributed`, whose package a single process never imports, so they live here). The ``distributed``
section, assembled from this class; torch-free."""

from __future__ import annotations

from dataclasses import dataclass

from grpokit.errors import require


@dataclass
class DistributedSettings:
    """Ray, sampling ahead, and torchrun's strategy."""

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

    def check(self) -> None:
        require(self.num_rollout_workers >= 1, f"num_rollout_workers={self.num_rollout_workers} must be >= 1.")
        require(
            self.rollout_worker_cpus >= 0 and self.rollout_worker_gpus >= 0,
            "rollout_worker_cpus and rollout_worker_gpus must be >= 0.",
        )
        require(
            not self.async_rollouts or self.backend == "ray",
            "async_rollouts needs backend: ray (rollouts are sampled by Ray workers while the learner trains); for a "
            "background thread in this process set max_staleness: 1 instead.",
        )
        require(
            self.max_staleness is None or self.max_staleness >= 0,
            f"max_staleness={self.max_staleness} must be >= 0 (0 = synchronous, K = up to K updates behind) or null.",
        )
        require(self.scoring_threads >= 1, f"scoring_threads={self.scoring_threads} must be >= 1.")
        require(
            not (self.async_rollouts and self.max_staleness == 0),
            "async_rollouts samples one step ahead, max_staleness: 0 never ahead; drop async_rollouts or set "
            "max_staleness >= 1.",
        )
        require(
            self.num_reward_workers >= 0,
            f"num_reward_workers={self.num_reward_workers} must be >= 0 (0 = rewards in the learner process).",
        )
        require(self.reward_worker_cpus >= 0, f"reward_worker_cpus={self.reward_worker_cpus} must be >= 0.")
        require(
            self.num_reward_workers == 0 or self.backend == "ray",
            f"num_reward_workers={self.num_reward_workers} needs backend: ray (Ray reward actors); "
            "without Ray use reward.reward_workers for worker processes of the learner.",
        )
        if self.backend == "ray" and self.address is None and self.ray_num_cpus is not None:
            wanted = (
                self.num_rollout_workers * self.rollout_worker_cpus + self.num_reward_workers * self.reward_worker_cpus
            )
            require(
                wanted <= self.ray_num_cpus,
                f"the Ray actors reserve {wanted:g} CPUs (num_rollout_workers x rollout_worker_cpus + "
                "num_reward_workers x reward_worker_cpus) but the local cluster has "
                f"ray_num_cpus={self.ray_num_cpus}, so some would never start; "
                "lower the workers or their CPUs, or raise ray_num_cpus.",
            )

    def staleness_bound(self) -> int:
        """K, the resolved max_staleness: as set, else 1 with async_rollouts and 0 without."""
        if self.max_staleness is not None:
            return self.max_staleness
        return 1 if self.async_rollouts else 0
