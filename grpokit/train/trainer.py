"""The GRPO training loop.

One step (DESIGN.md): prompts -> RolloutEngine.generate (G per prompt) -> RewardRunner.score ->
algos.compute_advantages -> reference log-probs -> Learner.update -> RolloutStore.write_step ->
Tracker.log; evaluation every eval_steps, checkpoints every save_steps.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
import warnings
from pathlib import Path
from typing import Any

import torch

from grpokit.algos import compute_advantages, zero_variance_groups
from grpokit.config import ConfigError, GRPOConfig
from grpokit.data.prompts import DataError, PromptSource, check_reward_columns, load_rows, reward_inputs
from grpokit.distributed.fsdp import full_state_dict, is_sharded, unsharded
from grpokit.distributed.seeding import generate_per_group, group_seed, split_rollouts
from grpokit.distributed.torch_dist import (
    init_distributed,
    score_rewards,
    trainable_state,
    wrap_data_parallel,
)
from grpokit.eval.evaluator import evaluate
from grpokit.hardware import autocast_dtype, pick_device
from grpokit.kernels import Kernels
from grpokit.memory import memory_warning
from grpokit.modeling import decode, ensure_pad_token, eos_token_ids
from grpokit.rewards.contract import RewardState
from grpokit.rollout.engine import HFRolloutEngine
from grpokit.rollout.types import Rollouts, SamplingParams
from grpokit.store.record import RolloutRecord, rollout_records
from grpokit.train import checkpoint, interrupt
from grpokit.train.callbacks import CallbackRunner
from grpokit.train.learner import Learner
from grpokit.train.logprobs import build_batch
from grpokit.train.reference import Reference
from grpokit.train.run_dir import check_run_dir, prepare_run_dir
from grpokit.train.schedule import make_scheduler
from grpokit.train.setup import build_policy, build_reward_runner, lora_settings


class GRPOTrainer:
    """Train a causal LM with GRPO-family RL.

    ``model``: a local path, a hub id, a loaded HF model or any module with ``forward(input_ids) -> logits``.
    ``reward_funcs``: a callable, a built-in name / ``module:function`` / ``file.py:function`` spec, or a list
    of them (weights in ``args.reward_weights``); defaults to ``args.rewards``.
    Datasets: a ``datasets.Dataset``, a list of dicts, or a JSONL / Parquet / CSV path, with a prompt column;
    the other columns are passed to the reward functions.

    TRL's arguments work as in TRL: ``processing_class`` (``tokenizer`` is the same), ``peft_config`` (a peft
    ``LoraConfig``: LoRA adapters, recorded in ``args.lora``), ``reward_processing_classes`` (tokenizers of
    ``nn.Module`` reward models), ``callbacks`` (transformers ``TrainerCallback``s, see train/callbacks.py) and
    ``optimizers=(optimizer, lr_scheduler)`` (either may be None: grpokit's AdamW / schedule). ``trainer.state``
    is a transformers ``TrainerState``: ``global_step`` (steps done), ``max_steps``, ``epoch``, ``log_history``.
    """

    def __init__(
        self,
        model: Any = None,
        reward_funcs: Any = None,
        args: GRPOConfig | None = None,
        train_dataset: Any = None,
        eval_dataset: Any = None,
        processing_class: Any = None,
        reward_processing_classes: Any = None,
        callbacks: list | None = None,
        optimizers: tuple = (None, None),
        peft_config: Any = None,
        tokenizer: Any = None,
    ):
        if tokenizer is not None and processing_class is not None and tokenizer is not processing_class:
            raise ConfigError("processing_class and tokenizer are the same argument; pass one of them.")
        tokenizer = processing_class if processing_class is not None else tokenizer
        args = args or GRPOConfig()
        if peft_config is not None:
            args = args.replace(lora=lora_settings(peft_config))
        self.args = args
        self.dist = init_distributed()  # rank and world size under torchrun; one process otherwise
        args.validate(self.dist.world_size)
        if args.engine == "vllm":
            from grpokit.rollout.vllm_engine import check_vllm_environment

            check_vllm_environment(self.dist.enabled)
        # Everything that can be checked without a model is checked first.
        self.train_rows = load_rows(
            train_dataset if train_dataset is not None else args.train_dataset, args.prompt_column
        )
        eval_source = eval_dataset if eval_dataset is not None else args.eval_dataset
        self.eval_rows = load_rows(eval_source, args.prompt_column, "eval_dataset") if eval_source is not None else None
        if self.dist.is_main:  # only rank 0 owns the run folder
            check_run_dir(args)
        # Ray reward workers live on rank 0, the only rank connected to Ray; it scores every rank's rows.
        self.rewards = build_reward_runner(
            reward_funcs if reward_funcs is not None else args.rewards,
            args,
            ray_workers=self.dist.is_main,
            processing_classes=reward_processing_classes,
        )
        reward_fns = dict(zip(self.rewards.names, self.rewards.functions))
        check_reward_columns(self.train_rows, reward_fns, args.prompt_column)
        if len(self.train_rows) < args.prompts_per_step(self.dist.world_size):
            raise DataError(
                f"train_dataset has {len(self.train_rows)} prompts but a step takes "
                f"{args.prompts_per_step(self.dist.world_size)} "
                "distinct ones; add prompts or lower per_device_train_batch_size x gradient_accumulation_steps / "
                "num_generations."
            )
        # prompts // prompts per step: TRL drops a last partial batch too
        self.steps_per_epoch = len(self.train_rows) // args.prompts_per_step(self.dist.world_size)
        if args.max_steps == -1:  # TRL: train num_train_epochs passes over the dataset
            self.args = args = args.replace(max_steps=max(1, math.ceil(args.num_train_epochs * self.steps_per_epoch)))
        if self.eval_rows:
            check_reward_columns(self.eval_rows, reward_fns, args.prompt_column, "eval_dataset")
        path = model if isinstance(model, str) else args.model_name_or_path if model is None else None
        if path and self.dist.is_main:  # a model given by path or hub id: its size is known before it is loaded
            warning = memory_warning(
                args, path, pick_device(args.device), processes=int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
            )
            if warning:
                warnings.warn(f"grpokit: {warning}", stacklevel=2)
        self.model, self.tokenizer, self.device, self.use_lora = build_policy(model, tokenizer, args, peft_config)
        ensure_pad_token(self.tokenizer)

        source_kw = dict(
            prompt_column=args.prompt_column, max_prompt_length=args.max_prompt_length, overflow=args.prompt_overflow
        )
        self.train_source = PromptSource(
            self.train_rows, self.tokenizer, seed=args.seed, shuffle=args.shuffle, **source_kw
        )
        self.eval_source = (
            PromptSource(self.eval_rows, self.tokenizer, shuffle=False, **source_kw) if self.eval_rows else None
        )

        torch.manual_seed(args.seed)
        eos = eos_token_ids(self.model, self.tokenizer)
        self.autocast_dtype = autocast_dtype(args.dtype, self.device, self.model)
        self.kernels = Kernels.select(self.device, self.autocast_dtype)  # this run's fast paths, chosen once
        if args.engine == "vllm":
            self.engine = self._start_vllm(model, eos)
        else:
            self.engine = HFRolloutEngine(
                self.model,
                eos,
                self.tokenizer.pad_token_id,
                self.device,
                seed=args.seed,
                autocast_dtype=self.autocast_dtype,
                kernels=self.kernels,
            )
        self.sampling = SamplingParams(
            args.max_completion_length, args.temperature, args.top_p, args.top_k, min_p=args.min_p
        )
        # Rollouts must not depend on how a step's prompts are split over processes or Ray workers.
        self.seed_per_group = args.seed_per_group or args.backend == "ray" or self.dist.enabled
        self.remote = self._start_ray(eos) if args.backend == "ray" and self.dist.is_main else None
        # async: (global batch of prompt indices, the next step's rollouts: rank 0's PendingRollouts in flight
        # or collected Rollouts; None on other ranks until scattered) of the next step
        self._pending = None
        self._published: int | None = None  # weights version last sent to the Ray workers
        self._resume_indices: list[int] | None = None

        self.reference = Reference(self.model, use_adapters=self.use_lora) if args.beta > 0 else None
        # FSDP shards in place and replaces the parameters, so it comes before the optimizer sees them;
        # the reference copy is sharded the same way (its pass and its resync stay shard by shard).
        trained = wrap_data_parallel(self.model, self.dist, self.device, args.strategy)
        if is_sharded(trained) and self.reference is not None and self.reference.model is not None:
            wrap_data_parallel(self.reference.model, self.dist, self.device, args.strategy)
        optimizer, scheduler = optimizers
        if optimizer is not None and is_sharded(trained):
            raise ConfigError(
                "optimizers=(optimizer, ...) cannot be used with strategy: fsdp, which replaces the parameters "
                "the optimizer holds; leave optimizers out (grpokit's AdamW) or use strategy: ddp."
            )
        params = [p for p in self.model.parameters() if p.requires_grad]
        # fused: one kernel per parameter, no foreach temporaries (on CPU ~4x faster than the default)
        self.optimizer = optimizer or torch.optim.AdamW(
            params,
            lr=args.learning_rate,
            betas=(args.adam_beta1, args.adam_beta2),
            eps=args.adam_epsilon,
            weight_decay=args.weight_decay,
            fused=self.device.type in ("cpu", "cuda"),
        )
        total = args.max_steps * args.num_iterations
        warmup = args.warmup_steps or int(args.warmup_ratio * total)
        self.scheduler = scheduler or make_scheduler(self.optimizer, args.lr_scheduler_type, warmup, total)
        self.learner = Learner(
            trained,
            self.reference,
            self.optimizer,
            self.scheduler,
            args,
            autocast_dtype=self.autocast_dtype,
            kernels=self.kernels,
        )
        self.step = 0
        self.stop_reason: str | None = None
        self.interrupted_by: int | None = None  # the signal that stopped training
        self._saved_step = 0  # the step of the newest checkpoint on disk (0: none)
        self._counters = {"kl_over": 0, "nonfinite": 0}
        self.callbacks = CallbackRunner(
            callbacks,
            args,
            args.max_steps,
            self.steps_per_epoch,
            self.dist.is_main,
            model=self.model,
            processing_class=self.tokenizer,
            optimizer=self.optimizer,
            lr_scheduler=self.scheduler,
        )
        self.callbacks.event("on_init_end")

    @property
    def state(self):
        """The run's transformers ``TrainerState`` (TRL's ``trainer.state``): global_step, max_steps, epoch,
        log_history."""
        return self.callbacks.state

    @property
    def processing_class(self):
        return self.tokenizer

    def add_callback(self, callback: Any) -> None:
        """Add a ``TrainerCallback`` (instance or class), as ``transformers.Trainer.add_callback``."""
        self.callbacks.add(callback)

    # ---- the loop --------------------------------------------------------------------------
    def train(self, resume_from_checkpoint: str | bool | None = None) -> dict:
        """Train to max_steps (or until stopped); returns the last step's metrics.

        ``resume_from_checkpoint`` (TRL's argument): True = the latest checkpoint of output_dir, or a checkpoint folder.
        """
        args = self.args
        if resume_from_checkpoint:
            args.resume_from = "latest" if resume_from_checkpoint is True else str(resume_from_checkpoint)
        if not self.dist.is_main:
            return self._train_other_rank()
        self.run_dir, self.store, self.tracker = prepare_run_dir(self)
        previous_handlers = interrupt.install(self._on_signal)
        metrics: dict = {}
        started = time.perf_counter()
        try:
            self._begin_training()
            while self.step < args.max_steps and self.stop_reason is None:
                metrics = self._run_step()
            self._finish()
            self._end_training(metrics, time.perf_counter() - started)
        finally:
            interrupt.restore(previous_handlers)
            self.tracker.close()
            self._write_report()
            self.store.close()
            self.rewards.close()  # reward workers (a later evaluate() starts them again)
            if self.remote is not None:
                self.remote.shutdown()
        if self.stop_reason:
            # soft_wrap: one line, however narrow the terminal
            self.tracker.console.print(
                f"[yellow]stopped at step {self.step}: {self.stop_reason}[/yellow]", soft_wrap=True
            )
        return metrics

    def _train_step(self, step: int) -> dict:
        args, G, dist = self.args, self.args.num_generations, self.dist
        t0 = time.perf_counter()
        indices, rollouts = self._next_rollouts(step)  # this rank's prompts, G rollouts each
        staleness = self.engine.policy_version - rollouts.policy_version  # updates since the sampling policy
        t1 = time.perf_counter()
        completion_ids = [
            ids[: int(n)].tolist() for ids, n in zip(rollouts.completion_ids, rollouts.completion_lengths)
        ]
        completions = [decode(self.tokenizer, ids) for ids in completion_ids]
        # This rank's rewards and every rank's, so groups are complete and batch-level scaling sees the whole batch.
        # Rewards get the prompts as the dataset holds them (chat messages stay messages), as TRL passes them.
        reward, all_rewards = score_rewards(
            dist,
            self.rewards,
            [self.train_rows[i][args.prompt_column] for i in indices for _ in range(G)],
            completions,
            self._columns(indices, rollouts, self.train_rows),
            G,
            on_main=args.num_reward_workers > 0,
            completion_ids=completion_ids,
            trainer_state=self._reward_state(step),
        )
        t2 = time.perf_counter()
        all_advantages = compute_advantages(
            all_rewards.combined, G, args.advantage_estimator, args.scale_rewards
        )  # [N_global]
        n = rollouts.completion_ids.size(0)
        advantages = all_advantages[dist.rank * n : (dist.rank + 1) * n].float().to(self.device)  # [N] this rank's rows
        loss_mask = rollouts.completion_mask.to(self.device)  # [N, T]
        if args.mask_truncated_completions:
            loss_mask = loss_mask * (~rollouts.truncated).to(self.device)[:, None].float()
        batch = build_batch(self.model, rollouts, self.tokenizer.pad_token_id, self.device)
        ref_logprobs = self.learner.reference_logprobs(batch)
        # DDP averages gradients over ranks, so dapo's per-rank denominator is the global token count / ranks.
        num_items = dist.sum(loss_mask.sum()).clamp(min=1.0) / dist.world_size
        # Async rollouts come from an older policy: the ratio is taken against their sampling log-probs.
        old_logprobs = rollouts.logprobs.to(self.device) if args.async_rollouts else None
        # vLLM's log-probs differ from the learner's for the same weights: they weight tokens (TIS), never replace
        # old_logprobs.
        tis = args.engine == "vllm" and args.vllm_importance_sampling_correction
        sampling_logprobs = rollouts.logprobs.to(self.device) if tis else None
        t3 = time.perf_counter()
        update = dist.mean_metrics(
            self.learner.update(
                batch,
                advantages,
                loss_mask,
                ref_logprobs,
                old_logprobs=old_logprobs,
                num_items_in_batch=num_items,
                sampling_logprobs=sampling_logprobs,
            )
        )
        self.engine.policy_version += 1  # colocated engine: it samples from these same weights next step
        t4 = time.perf_counter()

        lengths = dist.gather(rollouts.completion_lengths.float())  # [N_global]
        prompt_tokens = dist.sum(torch.tensor(float(sum(len(self.train_source.ids[i]) for i in indices) * G)))
        tokens = lengths.sum().item() + prompt_tokens.item()
        metrics = {
            **all_rewards.metrics(),
            **update,
            "advantage/mean": float(all_advantages.mean()),
            "advantage/std": float(all_advantages.std()),
            "frac_reward_zero_std": float(zero_variance_groups(all_rewards.combined, G).float().mean()),
            "completion_length/mean": float(lengths.mean()),
            "completion_length/min": float(lengths.min()),
            "completion_length/max": float(lengths.max()),
            "truncated_fraction": float(dist.gather(rollouts.truncated.float()).mean()),
            "prompts_truncated": float(self.train_source.num_truncated),
            "prompts_dropped": float(self.train_source.num_dropped),
            "policy_staleness": float(staleness),
            "time/generate": t1 - t0,
            "time/reward": t2 - t1,
            "time/logprobs": t3 - t2,
            "time/update": t4 - t3,
            "step_time": t4 - t0,
            "tokens_per_second": tokens / (t4 - t0),
        }
        if self.remote is not None:
            metrics["rollout_worker_restarts"] = float(self.remote.restarts)
        rows = dist.gather_objects(self._store_rows(indices, rollouts, completions, reward, advantages.cpu()))
        if dist.is_main:
            self.store.write_step(step, [r for part in rows for r in part], metrics)
            self.tracker.log(metrics, step)
            if args.log_completions and step % args.logging_steps == 0:
                self.tracker.log_completions([r for part in rows for r in part], step, args.num_completions_to_print)
        return metrics

    def _next_rollouts(self, step: int) -> tuple[list[int], Rollouts]:
        """This rank's prompt indices for ``step`` and their rollouts. In async mode they were sampled
        while the previous step trained, and the next step's sampling starts here."""
        if self._pending is not None:
            batch, pending = self._pending
            self._pending = None
            if pending is not None and not isinstance(
                pending, Rollouts
            ):  # rank 0, still in flight (a checkpoint collects them)
                pending = self.remote.collect(pending)
            rollouts = self._scatter(pending)
        else:
            batch = self._resume_indices or self._draw()
            self._resume_indices = None
            rollouts = self._sample(step, batch)
        if self.args.async_rollouts and step < self.args.max_steps:
            upcoming = self._draw()
            self._pending = (upcoming, self._submit(step + 1, upcoming))
        indices, _ = self.dist.shard(batch)
        return indices, rollouts

    def _draw(self) -> list[int]:
        """The next global batch of prompt indices (every rank draws the same batch)."""
        return self.train_source.next_indices(self.args.prompts_per_step(self.dist.world_size))

    def _prompts_and_seeds(self, step: int, indices: list[int], first: int) -> tuple[list[list[int]], list[int]]:
        """Token ids and group seeds of ``indices``, whose first group is group ``first`` of the step's global batch."""
        seeds = [group_seed(self.args.seed, step, first + j) for j in range(len(indices))]
        return [self.train_source.ids[i] for i in indices], seeds

    def _sample(self, step: int, batch: list[int]) -> Rollouts:
        """This rank's share of the rollouts of the global ``batch``."""
        G = self.args.num_generations
        if self.args.backend == "ray":
            pending = self._submit(step, batch)
            return self._scatter(None if pending is None else self.remote.collect(pending))
        indices, first = self.dist.shard(batch)
        with unsharded(self.model):  # FSDP: whole weights for sampling, gathered once
            if self.seed_per_group:
                return generate_per_group(self.engine, *self._prompts_and_seeds(step, indices, first), G, self.sampling)
            return self.engine.generate([self.train_source.ids[i] for i in indices], G, self.sampling)

    def _submit(self, step: int, batch: list[int]):
        """Start sampling the whole global ``batch`` on the Ray workers; rank 0 drives them and gets the
        pending handle, other ranks get None (their share arrives through :meth:`_scatter`)."""
        self._publish()
        if self.remote is None:
            return None
        return self.remote.submit(*self._prompts_and_seeds(step, batch, 0), self.args.num_generations, self.sampling)

    def _scatter(self, rollouts: Rollouts | None) -> Rollouts:
        """Rank 0's rollouts of the global batch -> this rank's contiguous share (the groups ``dist.shard`` gives
        it)."""
        return self.dist.scatter_objects(split_rollouts(rollouts, self.dist.world_size) if self.dist.is_main else None)

    def _publish(self) -> None:
        """Send the current weights to the Ray workers unless they already have this version. Rank 0
        publishes: with DDP it holds the whole policy; FSDP gathers it there from every rank."""
        version = self.engine.policy_version
        if self._published == version or not (self.dist.is_main or is_sharded(self.model)):
            return
        state = trainable_state(self.model)
        if self.remote is not None:
            self.remote.publish(state, version)
        self._published = version

    def _start_ray(self, eos: list[int]):
        """Rank 0 (the only process without torchrun) connects to Ray and starts the rollout workers."""
        from grpokit.distributed.ray_rollout import RayRolloutEngine, connect

        args = self.args
        connect(args.address, args.ray_num_cpus)
        return RayRolloutEngine(
            self.model,
            eos,
            self.tokenizer.pad_token_id,
            args.num_rollout_workers,
            args.rollout_worker_cpus,
            args.rollout_worker_gpus,
            self.autocast_dtype,
        )

    def _start_vllm(self, model: Any, eos: list[int]):
        """The colocated vLLM engine, built from the policy's folder or hub id (a loaded module: from its config)."""
        from grpokit.modeling import is_hf_model
        from grpokit.rollout.vllm_engine import VLLMRolloutEngine

        if not is_hf_model(self.model):
            raise ConfigError(
                "generation.engine: vllm samples Hugging Face causal LMs; a custom forward(input_ids) module needs "
                "generation.engine: hf."
            )
        args = self.args
        source = model if isinstance(model, str) else args.model_name_or_path if model is None else None
        max_len = args.vllm_max_model_length
        if max_len is None and args.max_prompt_length is not None:
            max_len = args.max_prompt_length + args.max_completion_length
        return VLLMRolloutEngine(
            self.model,
            eos,
            self.tokenizer.pad_token_id,
            source=source and os.path.expanduser(source),
            gpu_memory_utilization=args.vllm_gpu_memory_utilization,
            max_model_len=max_len,
            enable_sleep_mode=args.vllm_enable_sleep_mode,
            seed=args.seed,
            trust_remote_code=args.trust_remote_code,
        )

    def _train_other_rank(self) -> dict:
        """Ranks > 0 under torchrun: the same steps (metrics are averaged over ranks, so every rank
        stops together), without the run folder; rank 0 alone evaluates and writes checkpoints (these
        ranks join in only to gather FSDP-sharded weights)."""
        self.run_dir = Path(self.args.output_dir)  # read for resuming, never written here
        if self.args.resume_from is not None:
            found = checkpoint.resolve_resume(self.args.output_dir, self.args.resume_from)
            if found is not None:
                self.resume(found)
        self._begin_training()  # rank 0 evaluates; FSDP needs every rank to gather the weights
        metrics: dict = {}
        while self.step < self.args.max_steps and self.stop_reason is None:
            metrics = self._run_step()
        self._finish()
        self._close_epoch()
        self.callbacks.event("on_train_end")
        return metrics

    def _begin_training(self) -> None:
        """on_train_begin (and on_epoch_begin), then the evaluation before training."""
        self.callbacks.set_step(self.step)
        self.callbacks.state.max_steps = self.args.max_steps
        self.callbacks.event("on_train_begin")
        self.callbacks.event("on_epoch_begin")
        if self.step == 0 and self._eval_enabled():
            self._evaluate_and_log(0)

    def _run_step(self) -> dict:
        self.callbacks.event("on_step_begin")
        self.step += 1
        metrics = self._train_step(self.step)
        self._after_step(metrics)
        return metrics

    def _end_training(self, metrics: dict, seconds: float) -> None:
        """TRL's closing log entry (train_runtime, train_loss ...), a summary line, on_train_end."""
        losses = [h["loss"] for h in self.state.log_history if "loss" in h]
        summary = {
            "train_runtime": seconds,
            "train_steps_per_second": self.step / seconds if seconds else 0.0,
            "train_loss": sum(losses) / len(losses) if losses else metrics.get("loss", 0.0),
        }
        self._close_epoch()
        self.callbacks.log(summary)
        self.tracker.summary(self.step, summary, metrics)
        self.callbacks.event("on_train_end")

    def _close_epoch(self) -> None:
        """on_epoch_end for an epoch the run ended inside (transformers ends its epoch loop that way too)."""
        if self.step % self.steps_per_epoch:
            self.callbacks.event("on_epoch_end")

    def _finish(self) -> None:
        """Last checkpoint, evaluation and final model (every rank calls it: FSDP gathers the weights).
        Stopped by a signal: only the checkpoint of the last finished step, if it is not on disk yet."""
        if self.step > self._saved_step and (self.args.save_strategy != "no" or self.interrupted_by is not None):
            self._save_checkpoint()
        if self.interrupted_by is not None:
            name = interrupt.signal_name(self.interrupted_by)
            self.stop_reason = (
                f"received {name}; saved checkpoint step-{self.step}, resume with resume_from=latest"
                if self.step
                else f"received {name} before the first step finished; there was nothing to save"
            )
            return
        if self._eval_enabled() and not self._due("eval", self.step):
            self._evaluate_and_log(self.step)
        self._save_final_model()

    def _due(self, kind: str, step: int) -> bool:
        """Whether ``step`` is an evaluation / checkpoint step of the run's ``eval_strategy`` / ``save_strategy``."""
        args = self.args
        strategy, every = (
            (args.eval_strategy, args.eval_steps) if kind == "eval" else (args.save_strategy, args.save_steps)
        )
        if strategy == "epoch":
            every = self.steps_per_epoch
        return strategy != "no" and every > 0 and step % every == 0

    def _after_step(self, metrics: dict) -> None:
        args, step = self.args, self.step
        if args.ref_model_sync_steps and self.reference is not None and step % args.ref_model_sync_steps == 0:
            self.reference.sync(args.ref_model_mixup_alpha)
        self._counters["nonfinite"] = self._counters["nonfinite"] + 1 if metrics.get("nonfinite") else 0
        if self._counters["nonfinite"] >= args.max_nonfinite_steps:
            self.stop_reason = (
                f"{args.max_nonfinite_steps} steps in a row had a non-finite loss or gradient (updates skipped); "
                "lower learning_rate, check the reward functions for inf/NaN, or raise max_nonfinite_steps."
            )
        if args.max_kl is not None and metrics.get("kl", 0.0) > args.max_kl:
            self._counters["kl_over"] += 1
            if self._counters["kl_over"] >= args.max_kl_patience:
                self.stop_reason = (
                    f"mean KL {metrics['kl']:.4f} exceeded max_kl={args.max_kl} for {args.max_kl_patience} step(s)."
                )
        else:
            self._counters["kl_over"] = 0
        self.callbacks.set_step(step)
        control = self.callbacks.event(
            "on_step_end"
        )  # a callback may ask for a log, an evaluation, a checkpoint, the end
        if step % args.logging_steps == 0 or control.should_log:
            self.callbacks.log(metrics)
        if (self._due("eval", step) and self._eval_enabled()) or (
            control.should_evaluate and self.eval_source is not None
        ):
            self._evaluate_and_log(step)
        if (self._due("save", step) and step < args.max_steps) or control.should_save:
            self._save_checkpoint()
        if step % self.steps_per_epoch == 0:
            self.callbacks.event("on_epoch_end")
            if step < args.max_steps:
                self.callbacks.event("on_epoch_begin")
        if self.callbacks.control.should_training_stop and self.stop_reason is None:
            self.stop_reason = "a callback set control.should_training_stop"

    # ---- evaluation ------------------------------------------------------------------------
    def _eval_enabled(self) -> bool:
        strategy = self.args.eval_strategy
        return self.eval_source is not None and (
            strategy == "epoch" or (strategy == "steps" and self.args.eval_steps > 0)
        )

    def evaluate(self) -> dict[str, float]:
        """pass@k (k in args.pass_at_k), mean reward and greedy accuracy on the eval dataset."""
        if self.eval_source is None:
            raise ValueError("evaluate() needs an eval_dataset (argument or data.eval_dataset).")
        args = self.args
        params = SamplingParams(
            args.max_completion_length,
            args.eval_temperature or args.temperature,
            args.top_p,
            args.top_k,
            min_p=args.min_p,
        )
        return evaluate(
            self.engine,
            self.tokenizer,
            self.eval_source,
            self.eval_rows,
            self.rewards,
            trainer_state=self._reward_state(self.step + 1),
            num_samples=args.num_generations_eval,
            ks=args.pass_at_k,
            params=params,
            success_threshold=args.success_threshold,
            prompt_column=args.prompt_column,
            max_prompts=args.max_eval_prompts,
        )

    def _evaluate_and_log(self, step: int) -> None:
        """Rank 0 evaluates; under FSDP every rank joins to gather the weights for it."""
        with unsharded(self.model):
            if not self.dist.is_main:
                return
            metrics = self.evaluate()
        self.store.write_eval(step, "eval", metrics)
        self.tracker.log_eval(metrics, step)
        self.callbacks.state.log_history.append({**metrics, "epoch": self.state.epoch, "step": step})
        self.callbacks.event("on_evaluate", metrics=metrics)

    # ---- helpers ---------------------------------------------------------------------------
    def _reward_state(self, step: int) -> RewardState:
        """``trainer_state`` for the reward functions while step ``step`` is scored (TRL passes its state
        before the step's update: ``global_step`` counts the updates done)."""
        source = self.train_source
        return RewardState(
            global_step=step - 1,
            max_steps=self.args.max_steps,
            epoch=source.epoch + source.position / len(source.usable),
        )

    def _columns(self, indices: list[int], rollouts: Rollouts, rows: list[dict]) -> dict[str, list]:
        return reward_inputs(
            rows, indices, rollouts.num_generations, self.args.prompt_column, rollouts.completion_lengths.tolist()
        )

    def _store_rows(self, indices, rollouts, completions, reward, advantages) -> list[RolloutRecord]:
        return rollout_records(indices, rollouts, completions, reward, advantages, self.train_source)

    def _rng_states(self) -> dict:
        return {"torch": torch.get_rng_state(), "sampler": self.engine.generator.get_state()}

    def _save_checkpoint(self) -> None:
        """Rank 0 writes; under FSDP every rank joins to gather the weights and optimizer state."""
        if not (self.dist.is_main or is_sharded(self.model)):
            return
        synced = self.args.ref_model_sync_steps and self.reference is not None and self.reference.model is not None
        pending = None
        if (
            self._pending is not None and self.dist.is_main
        ):  # async: the next step's rollouts are saved, so a resume trains on the same data
            indices, rollouts = self._pending
            if not isinstance(rollouts, Rollouts):
                rollouts = self.remote.collect(rollouts)
                self._pending = (indices, rollouts)
            pending = dataclasses.asdict(rollouts)
        state = {
            "data": self.train_source.state_dict(),
            "policy_version": self.engine.policy_version,
            "counters": self._counters,
            "pending_indices": self._pending[0] if self._pending else None,
        }  # async: drawn, not yet trained on
        checkpoint.save_checkpoint(
            self.run_dir,
            self.step,
            self.model,
            self.optimizer,
            self.scheduler,
            state,
            self._rng_states(),
            reference_model=self.reference.model if synced else None,
            save_total_limit=self.args.save_total_limit,
            pending_rollouts=pending,
        )
        self._saved_step = self.step
        self.callbacks.event("on_save")

    def resume(self, path: str | Path) -> None:
        """Restore weights, optimizer, scheduler, RNG streams and data position from a checkpoint folder."""
        ref_model = self.reference.model if self.reference is not None else None
        state, rng = checkpoint.load_checkpoint(path, self.model, self.optimizer, self.scheduler, ref_model)
        self.step = self._saved_step = int(state["step"])
        self.callbacks.set_step(self.step)
        self.train_source.load_state_dict(state["data"])
        self.engine.policy_version = int(state["policy_version"])
        self._counters = dict(state["counters"])
        self._resume_indices = state.get("pending_indices")
        if state["pending_rollouts"] is not None:  # async: the step after the checkpoint was sampled before it
            self._pending, self._resume_indices = (self._resume_indices, Rollouts(**state["pending_rollouts"])), None
        torch.set_rng_state(rng["torch"])
        self.engine.generator.set_state(rng["sampler"])

    def _save_final_model(self) -> None:
        """Rank 0 writes ``final/``; under FSDP every rank joins to gather the weights."""
        if is_sharded(self.model):
            state = full_state_dict(self.model)
            if self.dist.is_main:
                self._save_final_weights(state)
        elif self.dist.is_main:
            self._save_final_weights(None)

    def _save_final_weights(self, state: dict | None) -> None:
        """``state``: the gathered full state dict of a sharded model, None to save the module's own."""
        final = self.run_dir / "final"
        if hasattr(self.model, "save_pretrained"):
            self.model.save_pretrained(final, state_dict=state)
            if self.use_lora and self.args.merge_on_save:
                import copy

                copy.deepcopy(self.model).merge_and_unload().save_pretrained(final / "merged")
        else:
            from safetensors.torch import save_file, save_model

            final.mkdir(parents=True, exist_ok=True)
            if state is None:
                save_model(self.model, str(final / "model.safetensors"))
            else:
                save_file(state, str(final / "model.safetensors"), metadata={"format": "pt"})
        if hasattr(self.tokenizer, "save_pretrained"):
            self.tokenizer.save_pretrained(final)

    def _write_report(self) -> None:
        from grpokit.store.report import write_report

        try:
            write_report(self.run_dir)
        except Exception as exc:  # a report must never cost the run its results
            self.tracker.console.print(f"[yellow]could not write report.html: {exc}[/yellow]")

    def _on_signal(self, signum: int, frame) -> None:
        """SIGINT / SIGTERM during training: finish the step in progress, then stop with its checkpoint
        (see :mod:`grpokit.train.interrupt`); a second signal stops at once."""
        if self.interrupted_by is not None:
            last = f"checkpoint step-{self._saved_step}" if self._saved_step else "no checkpoint"
            name = interrupt.signal_name(signum)
            raise interrupt.Interrupted(
                signum,
                f"stopped at once by a second {name}, during step {self.step}; "
                f"the last saved state is {last} (resume_from=latest)",
            )
        self.interrupted_by = signum
        self.stop_reason = f"received {interrupt.signal_name(signum)}"
