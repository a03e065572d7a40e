"""The GRPO training loop.

One step (DESIGN.md): RolloutScheduler.next (prompts, G rollouts each) -> RewardRunner.score ->
algos.compute_advantages -> reference log-probs -> Learner.update -> RolloutStore.write_step ->
Tracker.log; evaluation every eval_steps, checkpoints every save_steps. Every torchrun rank runs this
same loop; rank 0 alone owns the run folder.
"""

from __future__ import annotations

import dataclasses
import math
import time
from pathlib import Path
from typing import Any

import torch

from grpokit.algos import compute_advantages, zero_variance_groups
from grpokit.config import ConfigError, GRPOConfig
from grpokit.data.prompts import load_rows, reward_inputs
from grpokit.eval.evaluator import evaluate
from grpokit.hardware import autocast_dtype
from grpokit.kernels import Kernels
from grpokit.modeling import decode, ensure_pad_token
from grpokit.processes import is_sharded
from grpokit.rewards.contract import RewardState
from grpokit.rollout.types import Rollouts, SamplingParams
from grpokit.store.record import RolloutRecord, rollout_records
from grpokit.train import checkpoint
from grpokit.train.callbacks import CallbackRunner
from grpokit.train.interrupt import SignalStop, signal_name
from grpokit.train.learner import Learner
from grpokit.train.logprobs import build_batch
from grpokit.train.reference import Reference
from grpokit.train.run_dir import check_run_dir, open_run_dir, resume_point
from grpokit.train.scheduler import RolloutScheduler
from grpokit.train.setup import (
    build_optimizer,
    build_policy,
    build_reward_runner,
    check_data,
    lora_settings,
    prompt_sources,
    run_processes,
    warn_if_too_big,
)
from grpokit.train.stopping import StopRules


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
        self.procs = run_processes()  # rank and world size under torchrun; one process otherwise
        args.validate(self.procs.world_size)
        if args.engine == "vllm":
            from grpokit.rollout.vllm_engine import check_vllm_environment

            check_vllm_environment(self.procs.enabled)
        # Everything that can be checked without a model is checked first.
        self.train_rows = load_rows(
            train_dataset if train_dataset is not None else args.train_dataset, args.prompt_column
        )
        eval_source = eval_dataset if eval_dataset is not None else args.eval_dataset
        self.eval_rows = load_rows(eval_source, args.prompt_column, "eval_dataset") if eval_source is not None else None
        if self.procs.is_main:  # only rank 0 owns the run folder
            check_run_dir(args)
        # Ray reward workers live on rank 0, the only rank connected to Ray; it scores every rank's rows.
        self.rewards = build_reward_runner(
            reward_funcs if reward_funcs is not None else args.rewards,
            args,
            ray_workers=self.procs.is_main,
            processing_classes=reward_processing_classes,
        )
        self.steps_per_epoch = check_data(args, self.train_rows, self.eval_rows, self.rewards, self.procs.world_size)
        if args.max_steps == -1:  # TRL: train num_train_epochs passes over the dataset
            self.args = args = args.replace(max_steps=max(1, math.ceil(args.num_train_epochs * self.steps_per_epoch)))
        path = model if isinstance(model, str) else args.model_name_or_path if model is None else None
        if path and self.procs.is_main:
            warn_if_too_big(args, path)
        self.model, self.tokenizer, self.device, self.use_lora = build_policy(model, tokenizer, args, peft_config)
        ensure_pad_token(self.tokenizer)
        self.train_source, self.eval_source = prompt_sources(args, self.tokenizer, self.train_rows, self.eval_rows)
        torch.manual_seed(args.seed)
        self.autocast_dtype = autocast_dtype(args.dtype, self.device, self.model)
        self.kernels = Kernels.select(self.device, self.autocast_dtype)  # this run's fast paths, chosen once
        self.rollout_scheduler = RolloutScheduler(
            args,
            self.model,
            self.tokenizer,
            self.train_source,
            self.procs,
            self.device,
            self.autocast_dtype,
            path,
            kernels=self.kernels,
        )
        self.reference = Reference(self.model, use_adapters=self.use_lora) if args.beta > 0 else None
        # FSDP shards in place and replaces the parameters, so it comes before the optimizer sees them;
        # the reference copy is sharded the same way (its pass and its resync stay shard by shard).
        trained = self.procs.wrap(self.model, self.device, args.strategy)
        if is_sharded(trained) and self.reference is not None and self.reference.model is not None:
            self.procs.wrap(self.reference.model, self.device, args.strategy)
        self.optimizer, self.scheduler = build_optimizer(self.model, args, optimizers, is_sharded(trained), self.device)
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
        self.signals = SignalStop(lambda: (self.step, self._saved_step), enabled=self.procs.is_main)
        self._saved_step = 0  # the step of the newest checkpoint on disk (0: none)
        self.stop_rules = StopRules(args)  # non-finite steps, KL over max_kl
        self.callbacks = CallbackRunner(
            callbacks,
            args,
            args.max_steps,
            self.steps_per_epoch,
            self.procs.is_main,
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

    @property
    def engine(self):
        """The rollout engine sampling in this process (HF or vLLM)."""
        return self.rollout_scheduler.engine

    @property
    def sampling(self) -> SamplingParams:
        return self.rollout_scheduler.sampling

    @property
    def interrupted_by(self) -> int | None:
        """The signal that stopped training (None: none did)."""
        return self.signals.signum

    def add_callback(self, callback: Any) -> None:
        """Add a ``TrainerCallback`` (instance or class), as ``transformers.Trainer.add_callback``."""
        self.callbacks.add(callback)

    # ---- the loop --------------------------------------------------------------------------
    def train(self, resume_from_checkpoint: str | bool | None = None):
        """Train to max_steps (or until stopped); returns transformers' ``TrainOutput(global_step, training_loss,
        metrics)`` as TRL does (metrics: train_runtime, train_samples_per_second, train_steps_per_second,
        train_loss, epoch; about the steps run in this call). Every rank runs this loop (metrics are averaged
        over ranks, so every rank stops together); rank 0 alone writes the run folder, evaluates and saves
        (other ranks join in only to gather FSDP-sharded weights).

        ``resume_from_checkpoint`` (TRL's argument): True = the latest checkpoint of output_dir, or a checkpoint folder.
        """
        args, main = self.args, self.procs.is_main
        if resume_from_checkpoint:
            args.resume_from = "latest" if resume_from_checkpoint is True else str(resume_from_checkpoint)
        found = resume_point(args, check=main)
        if found is not None:  # loaded before the run folder is written: a misfit changes nothing there
            self.resume(found)
        self.run_dir = Path(args.output_dir)
        if main:
            self.run_dir, self.store, self.tracker = open_run_dir(args, self.step)
        metrics, losses, started = {}, [], time.perf_counter()
        try:
            with self.signals:
                self._begin_training()
                while self.step < args.max_steps and self.stop_reason is None and self.interrupted_by is None:
                    metrics = self._run_step()
                    losses.append(metrics["loss"])
                self._finish()
                summary = self._end_training(metrics, losses, time.perf_counter() - started)
        finally:
            self._close()
        if self.stop_reason and main:  # soft_wrap: one line, however narrow the terminal
            self.tracker.console.print(
                f"[yellow]stopped at step {self.step}: {self.stop_reason}[/yellow]", soft_wrap=True
            )
        from transformers.trainer_utils import TrainOutput

        return TrainOutput(self.step, summary["train_loss"], summary)

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

    def _train_step(self, step: int) -> dict:
        args, G, procs = self.args, self.args.num_generations, self.procs
        t0 = time.perf_counter()
        indices, rollouts = self.rollout_scheduler.next(step)  # this rank's prompts, G rollouts each
        staleness = self.engine.policy_version - rollouts.policy_version  # updates since the sampling policy
        t1 = time.perf_counter()
        completion_ids = [
            ids[: int(n)].tolist() for ids, n in zip(rollouts.completion_ids, rollouts.completion_lengths)
        ]
        completions = [decode(self.tokenizer, ids) for ids in completion_ids]
        # This rank's rewards and every rank's, so groups are complete and batch-level scaling sees the whole batch.
        # Rewards get the prompts as the dataset holds them (chat messages stay messages), as TRL passes them.
        reward, all_rewards = procs.score_rewards(
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
        advantages = all_advantages[procs.rank * n : (procs.rank + 1) * n].float().to(self.device)  # [N] this rank's
        loss_mask = rollouts.completion_mask.to(self.device)  # [N, T]
        if args.mask_truncated_completions:
            loss_mask = loss_mask * (~rollouts.truncated).to(self.device)[:, None].float()
        batch = build_batch(self.model, rollouts, self.tokenizer.pad_token_id, self.device)
        ref_logprobs = self.learner.reference_logprobs(batch)
        # DDP averages gradients over ranks, so dapo's per-rank denominator is the global token count / ranks.
        num_items = procs.sum(loss_mask.sum()).clamp(min=1.0) / procs.world_size
        # Async rollouts come from an older policy: the ratio is taken against their sampling log-probs.
        old_logprobs = rollouts.logprobs.to(self.device) if args.async_rollouts else None
        # vLLM's log-probs differ from the learner's for the same weights: they weight tokens (TIS), never replace
        # old_logprobs.
        tis = args.engine == "vllm" and args.vllm_importance_sampling_correction
        sampling_logprobs = rollouts.logprobs.to(self.device) if tis else None
        t3 = time.perf_counter()
        update = procs.mean_metrics(
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

        lengths = procs.gather(rollouts.completion_lengths.float())  # [N_global]
        prompt_tokens = procs.sum(torch.tensor(float(sum(len(self.train_source.ids[i]) for i in indices) * G)))
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
            "truncated_fraction": float(procs.gather(rollouts.truncated.float()).mean()),
            "prompts_truncated": float(self.train_source.num_truncated),
            "prompts_dropped": float(self.train_source.num_dropped),
            "policy_staleness": float(staleness),
            "time/generate": t1 - t0,
            "time/reward": t2 - t1,
            "time/logprobs": t3 - t2,
            "time/update": t4 - t3,
            "step_time": t4 - t0,
            "tokens_per_second": tokens / (t4 - t0),
            **self.rollout_scheduler.metrics(),
        }
        rows = procs.gather_objects(self._store_rows(indices, rollouts, completions, reward, advantages.cpu()))
        if procs.is_main:
            self.store.write_step(step, [r for part in rows for r in part], metrics)
            self.tracker.log(metrics, step)
            if args.log_completions and step % args.logging_steps == 0:
                self.tracker.log_completions([r for part in rows for r in part], step, args.num_completions_to_print)
        return metrics

    def _after_step(self, metrics: dict) -> None:
        args, step = self.args, self.step
        if args.ref_model_sync_steps and self.reference is not None and step % args.ref_model_sync_steps == 0:
            self.reference.sync(args.ref_model_mixup_alpha)
        reason = self.stop_rules.check(metrics)
        self.stop_reason = reason or self.stop_reason
        self.callbacks.set_step(step)
        # a callback may ask for a log, an evaluation, a checkpoint, the end
        control = self.callbacks.event("on_step_end")
        if step % args.logging_steps == 0 or control.should_log:
            self.callbacks.log(metrics)
        if (self.callbacks.due("eval", step) and self._eval_enabled()) or (
            control.should_evaluate and self.eval_source is not None
        ):
            self._evaluate_and_log(step)
        if (self.callbacks.due("save", step) and step < args.max_steps) or control.should_save:
            self._save_checkpoint()
        if step % self.steps_per_epoch == 0:
            self.callbacks.event("on_epoch_end")
            if step < args.max_steps:
                self.callbacks.event("on_epoch_begin")
        if self.callbacks.control.should_training_stop and self.stop_reason is None:
            self.stop_reason = "a callback set control.should_training_stop"

    def _finish(self) -> None:
        """Last checkpoint, evaluation and final model (every rank calls it: FSDP gathers the weights).
        Stopped by a signal: only the checkpoint of the last finished step, if it is not on disk yet."""
        if self.step > self._saved_step and (self.args.save_strategy != "no" or self.interrupted_by is not None):
            self._save_checkpoint()
        if self.interrupted_by is not None:
            name = signal_name(self.interrupted_by)
            self.stop_reason = (
                f"received {name}; saved checkpoint step-{self.step}, resume with resume_from=latest"
                if self.step
                else f"received {name} before the first step finished; there was nothing to save"
            )
            return
        if self._eval_enabled() and not self.callbacks.due("eval", self.step):
            self._evaluate_and_log(self.step)
        merged = self.use_lora and self.args.merge_on_save
        checkpoint.save_final_model(self.run_dir / "final", self.model, self.tokenizer, self.procs.is_main, merged)

    def _end_training(self, metrics: dict, losses: list[float], seconds: float) -> dict:
        """TRL's closing log entry (transformers' speed metrics and the mean loss of the steps run in this call),
        a summary line on rank 0, on_train_end; returns the entry."""
        steps, completions = len(losses), self.args.completions_per_step(self.procs.world_size)
        summary = {
            "train_runtime": round(seconds, 4),
            "train_samples_per_second": round(steps * completions / seconds, 3) if seconds else 0.0,
            "train_steps_per_second": round(steps / seconds, 3) if seconds else 0.0,
            "train_loss": sum(losses) / steps if steps else 0.0,
        }
        if self.step % self.steps_per_epoch:  # on_epoch_end for an epoch the run ended inside, as transformers does
            self.callbacks.event("on_epoch_end")
        if self.procs.is_main:
            self.callbacks.log(summary)
            self.tracker.summary(self.step, summary, metrics)
        self.callbacks.event("on_train_end")
        return summary | {"epoch": self.state.epoch}

    def _close(self) -> None:
        """Close what the run opened, whatever stopped it: trackers, report, store, reward workers (a later
        evaluate() starts them again) and Ray rollout workers."""
        if self.procs.is_main:
            self.tracker.close()
            self._write_report()
            self.store.close()
        self.rewards.close()
        self.rollout_scheduler.close()

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
        params = dataclasses.replace(self.sampling, temperature=args.eval_temperature or args.temperature)
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
        with self.procs.unsharded(self.model):
            if not self.procs.is_main:
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

    # ---- checkpoints -----------------------------------------------------------------------
    def _save_checkpoint(self) -> None:
        """Rank 0 writes; under FSDP every rank joins to gather the weights and optimizer state."""
        if not (self.procs.is_main or is_sharded(self.model)):
            return
        synced = self.args.ref_model_sync_steps and self.reference is not None and self.reference.model is not None
        scheduled, pending = self.rollout_scheduler.state_dict()
        state = {"data": self.train_source.state_dict(), "counters": self.stop_rules.counters, **scheduled}
        rng = {"torch": torch.get_rng_state(), "sampler": self.engine.generator.get_state()}
        checkpoint.save_checkpoint(
            self.run_dir,
            self.step,
            self.model,
            self.optimizer,
            self.scheduler,
            state,
            rng,
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
        self.rollout_scheduler.load_state_dict(state, state["pending_rollouts"])
        self.stop_rules.counters = dict(state["counters"])
        torch.set_rng_state(rng["torch"])
        self.engine.generator.set_state(rng["sampler"])

    def _write_report(self) -> None:
        from grpokit.store.report import write_report

        try:
            write_report(self.run_dir)
        except Exception as exc:  # a report must never cost the run its results
            self.tracker.console.print(f"[yellow]could not write report.html: {exc}[/yellow]")
