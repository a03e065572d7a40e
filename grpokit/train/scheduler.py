"""Which prompts each step trains on, and their rollouts, however they are sampled.

- sync (the default): the step's global batch of prompts is drawn and sampled in the step, by the
  colocated engine (HF, or vLLM with ``engine: vllm``) or, with ``backend: ray``, by Ray rollout workers.
- async (``async_rollouts``, Ray): the next step's batch is drawn and submitted to the workers before
  this step trains, so sampling overlaps the update (one step off-policy). The pending batch is part
  of a checkpoint (its prompt indices, and its rollouts collected), so a resume trains on the same data.
- dynamic sampling (DAPO, sync, one process): ``more(step, r)`` draws and samples round r's further batch
  within the step (``train/dynamic_sampling.py`` runs the rounds).

Under torchrun every rank draws the same global batch and keeps its share of groups (``procs.shard``);
with Ray, rank 0 drives the workers and scatters each rank's share. Rollouts must not depend on that
split, so then each group is sampled with its own seed (:mod:`grpokit.rollout.seeding`).
"""

from __future__ import annotations

import dataclasses
import os

from grpokit.config import ConfigError
from grpokit.data.prompts import PromptSource
from grpokit.modeling import eos_token_ids
from grpokit.rollout.engine import HFRolloutEngine
from grpokit.rollout.seeding import generate_per_group, group_seed, split_rollouts
from grpokit.rollout.types import Rollouts, SamplingParams
from grpokit.train.tool_rollouts import ToolRollouts, conversation_metrics


class RolloutScheduler:
    """``next(step)`` -> this rank's prompt indices and their rollouts (G per prompt) for ``step``.

    ``procs``: the :class:`~grpokit.processes.SingleProcess` context (or a torchrun rank's). ``source``:
    the model's folder or hub id when it was given by name (vLLM loads its copy from there), else None.
    ``tools``: the run's :class:`~grpokit.train.tool_rollouts.ToolSpec` (multi-turn tool rollouts), or None.
    """

    def __init__(
        self,
        args,
        model,
        tokenizer,
        prompts: PromptSource,
        procs,
        device,
        autocast_dtype,
        source=None,
        kernels=None,
        tools=None,
    ):
        self.args, self.model, self.prompts, self.procs = args, model, prompts, procs
        eos = eos_token_ids(model, tokenizer)
        if args.engine == "vllm":
            self.engine = _start_vllm(args, model, eos, tokenizer.pad_token_id, source)
        else:
            self.engine = HFRolloutEngine(
                model,
                eos,
                tokenizer.pad_token_id,
                device,
                seed=args.seed,
                autocast_dtype=autocast_dtype,
                kernels=kernels,
            )
        # temperature, top-p/k, min-p, repetition penalty and TRL's generation_kwargs (checked by the config)
        self.sampling = SamplingParams(args.max_completion_length, args.temperature, **args.sampling_options())
        # multi-turn tool rollouts on the HF engine (the config refuses tools with vLLM and Ray)
        self.tool_rollouts = (
            None
            if tools is None
            else ToolRollouts(tools, self.engine, tokenizer, args.prompt_column, args.chat_template_kwargs)
        )
        self._tool_metrics: dict[str, float] = {}
        # Rollouts must not depend on how a step's prompts are split over processes or Ray workers.
        self.seed_per_group = args.seed_per_group or args.backend == "ray" or procs.enabled
        # Rank 0 (the only process without torchrun) connects to Ray and starts the rollout workers.
        self.remote = (
            _start_ray(args, model, eos, tokenizer.pad_token_id, autocast_dtype)
            if args.backend == "ray" and procs.is_main
            else None
        )
        # async: (global batch of prompt indices, the next step's rollouts: rank 0's PendingRollouts in flight
        # or collected Rollouts; None on other ranks until scattered) of the next step
        self._pending = None
        self._published: int | None = None  # weights version last sent to the Ray workers
        self._resume_indices: list[int] | None = None  # a checkpoint's drawn batch, not yet sampled

    def next(self, step: int) -> tuple[list[int], Rollouts]:
        """This rank's prompt indices for ``step`` and their rollouts. In async mode they were sampled
        while the previous step trained, and the next step's sampling starts here."""
        if self._pending is not None:
            batch, pending = self._pending
            self._pending = None
            if pending is not None and not isinstance(pending, Rollouts):  # rank 0, still in flight
                pending = self.remote.collect(pending)
            rollouts = self._scatter(pending)
        else:
            batch = self._resume_indices or self._draw()
            self._resume_indices = None
            rollouts = self._sample(step, batch)
        if self.args.async_rollouts and step < self.args.max_steps:
            upcoming = self._draw()
            self._pending = (upcoming, self._submit(step + 1, upcoming))
        indices, _ = self.procs.shard(batch)
        return indices, rollouts

    def more(self, step: int, round_index: int) -> tuple[list[int], Rollouts]:
        """Dynamic sampling's round ``round_index`` (>= 1) of ``step`` (sync, one process): a fresh batch of prompts
        and their rollouts. With a seed per group, its groups number on after the earlier rounds'."""
        batch = self._draw()
        return batch, self._sample(step, batch, first_group=round_index * len(batch))

    def metrics(self) -> dict[str, float]:
        """Sampling's metrics of the last step: Ray worker restarts, tool calls (multi-turn rollouts)."""
        restarts = {} if self.remote is None else {"rollout_worker_restarts": float(self.remote.restarts)}
        return restarts | self._tool_metrics

    @property
    def environments(self) -> list | None:
        """The environment instances of the last sampled rollouts, in order (None without environments)."""
        return None if self.tool_rollouts is None else self.tool_rollouts.environments

    def state_dict(self) -> tuple[dict, dict | None]:
        """(the checkpoint's trainer-state entries, async mode's pending rollouts of the next step or None).
        Rank 0 collects pending rollouts still in flight: a resume trains on the same data."""
        pending = None
        if self._pending is not None and self.procs.is_main:
            indices, rollouts = self._pending
            if not isinstance(rollouts, Rollouts):
                rollouts = self.remote.collect(rollouts)
                self._pending = (indices, rollouts)
            pending = dataclasses.asdict(rollouts)
        state = {
            "policy_version": self.engine.policy_version,
            "pending_indices": self._pending[0] if self._pending else None,  # async: drawn, not yet trained on
        }
        return state, pending

    def load_state_dict(self, state: dict, pending_rollouts: dict | None) -> None:
        self.engine.policy_version = int(state["policy_version"])
        self._resume_indices = state.get("pending_indices")
        if pending_rollouts is not None:  # async: the step after the checkpoint was sampled before it
            self._pending, self._resume_indices = (self._resume_indices, Rollouts.from_dict(pending_rollouts)), None

    def close(self) -> None:
        if self.remote is not None:
            self.remote.shutdown()
        if self.tool_rollouts is not None:
            self.tool_rollouts.close()

    def _draw(self) -> list[int]:
        """The next global batch of prompt indices (every rank draws the same batch)."""
        return self.prompts.next_indices(self.args.prompts_per_step(self.procs.world_size))

    def _prompts_and_seeds(self, step: int, indices: list[int], first: int) -> tuple[list[list[int]], list[int]]:
        """Token ids and group seeds of ``indices``, whose first group is group ``first`` of the step's global batch."""
        seeds = [group_seed(self.args.seed, step, first + j) for j in range(len(indices))]
        return [self.prompts.ids[i] for i in indices], seeds

    def _sample(self, step: int, batch: list[int], first_group: int = 0) -> Rollouts:
        """This rank's share of the rollouts of the global ``batch``, whose first group is group ``first_group`` of
        the step (for the seeds per group)."""
        G = self.args.num_generations
        if self.args.backend == "ray":
            pending = self._submit(step, batch, first_group)
            return self._scatter(None if pending is None else self.remote.collect(pending))
        indices, first = self.procs.shard(batch)
        first += first_group
        with self.procs.unsharded(self.model):  # FSDP: whole weights for sampling, gathered once
            if self.tool_rollouts is not None:  # groups seeded on their own, decoded in one batch
                _, seeds = self._prompts_and_seeds(step, indices, first)
                rows = [self.prompts.rows[i] for i in indices]
                rollouts = self.tool_rollouts.generate(rows, G, self.sampling, seeds)
                self._tool_metrics = conversation_metrics(rollouts.conversations)
                return rollouts
            if self.seed_per_group:
                return generate_per_group(self.engine, *self._prompts_and_seeds(step, indices, first), G, self.sampling)
            return self.engine.generate([self.prompts.ids[i] for i in indices], G, self.sampling)

    def _submit(self, step: int, batch: list[int], first_group: int = 0):
        """Start sampling the whole global ``batch`` (first group: ``first_group`` of the step) on the Ray workers;
        rank 0 drives them and gets the pending handle, other ranks get None (their share arrives through
        :meth:`_scatter`)."""
        self._publish()
        if self.remote is None:
            return None
        seeded = self._prompts_and_seeds(step, batch, first_group)
        return self.remote.submit(*seeded, self.args.num_generations, self.sampling)

    def _scatter(self, rollouts: Rollouts | None) -> Rollouts:
        """Rank 0's rollouts of the global batch -> this rank's contiguous share (the groups ``shard`` gives it)."""
        procs = self.procs
        return procs.scatter_objects(split_rollouts(rollouts, procs.world_size) if procs.is_main else None)

    def _publish(self) -> None:
        """Send the current weights to the Ray workers unless they already have this version. Rank 0
        publishes: with DDP it holds the whole policy; FSDP gathers it there from every rank."""
        from grpokit.distributed.torch_dist import trainable_state
        from grpokit.processes import is_sharded

        version = self.engine.policy_version
        if self._published == version or not (self.procs.is_main or is_sharded(self.model)):
            return
        state = trainable_state(self.model)
        if self.remote is not None:
            self.remote.publish(state, version)
        self._published = version


def _start_ray(args, model, eos: list[int], pad_token_id: int, autocast_dtype):
    """Connect to Ray (``distributed.address``) and start the rollout workers."""
    from grpokit.distributed.ray_rollout import RayRolloutEngine, connect

    connect(args.address, args.ray_num_cpus)
    return RayRolloutEngine(
        model,
        eos,
        pad_token_id,
        args.num_rollout_workers,
        args.rollout_worker_cpus,
        args.rollout_worker_gpus,
        autocast_dtype,
    )


def _start_vllm(args, model, eos: list[int], pad_token_id: int, source: str | None):
    """The colocated vLLM engine, built from the policy's folder or hub id (a loaded module: from its config)."""
    from grpokit.modeling import is_hf_model
    from grpokit.rollout.vllm_engine import VLLMRolloutEngine

    if not is_hf_model(model):
        raise ConfigError(
            "generation.engine: vllm samples Hugging Face causal LMs; a custom forward(input_ids) module needs "
            "generation.engine: hf."
        )
    max_len = args.vllm_max_model_length
    if max_len is None and args.max_prompt_length is not None:
        max_len = args.max_prompt_length + args.max_completion_length
    return VLLMRolloutEngine(
        model,
        eos,
        pad_token_id,
        source=source and os.path.expanduser(source),
        gpu_memory_utilization=args.vllm_gpu_memory_utilization,
        max_model_len=max_len,
        enable_sleep_mode=args.vllm_enable_sleep_mode,
        seed=args.seed,
        trust_remote_code=args.trust_remote_code,
    )
