"""The training loop: a built :class:`~grpokit.compose.Run`, stepped to ``max_steps``.

Each step reads top to bottom (:meth:`Loop._train_step`, :meth:`Loop._after_step`): sample and score
(``experience/``), learn (reference log-probs, the algorithm's advantages, ``Learner.update``), record (store and
metrics.jsonl, rank 0), checkpoint, evaluate (``evaluation.py``). Every torchrun rank runs it; rank 0 alone owns the
run folder. It never reads the config: what it needs is in the Run and its :class:`~grpokit.train.loop_spec.LoopSpec`.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from grpokit.algos.algorithms import AdvantageInputs
from grpokit.algos.multi_objective import normalize_then_sum
from grpokit.algos.names import BETA, KL
from grpokit.train.evaluation import log_evaluations
from grpokit.train.interrupt import SignalStop, stop_message
from grpokit.train.learning.learner import update_inputs
from grpokit.train.learning.policy_logprobs import build_batch
from grpokit.train.metrics import PhaseClock, train_summary, trl_names, window_log
from grpokit.train.recording import step_record
from grpokit.train.rundir.checkpoint import save_final_model
from grpokit.train.rundir.folder import RunFolder, open_run_dir, resume_point


class Loop:
    """Runs a built Run (``run``: :class:`grpokit.compose.Run`): :meth:`train` to max_steps, :meth:`evaluate` on
    demand. Holds the run's progress (``step``, ``stop_reason``) and, while training, its run folder."""

    def __init__(self, run, evaluate=None, on_records=None):
        self.run, self.spec = run, run.spec
        self._evaluate_in_training = evaluate or self.evaluate  # a wrapper's evaluate() (GRPOTrainer's, overridable)
        self._on_records = on_records  # rank 0: fn(records) after each step is stored (GRPOTrainer's _logs)
        self.step = 0
        self.stop_reason: str | None = None
        self.run_dir_spec = run.run_dir_spec
        self.writing = False  # rank 0 while train() runs: evaluations go to the run folder too
        self._unlogged: list[dict] = []  # TRL-named metrics of the steps since the last log entry
        self.signals = SignalStop(lambda: (self.step, run.run_state.saved_step), enabled=run.procs.is_main)

    @property
    def interrupted_by(self) -> int | None:
        """The signal that stopped training (None: none did)."""
        return self.signals.signum

    def train(self, resume: str | None = None) -> dict:
        """Train to max_steps (or until stopped); returns the closing summary (train_runtime, train_loss ...).
        ``resume``: "latest" or a checkpoint folder (None: the run folder's own setting)."""
        main = self.run.procs.is_main
        if resume is not None:
            self.run_dir_spec = self.run_dir_spec.resuming(resume)
        self.run_folder = RunFolder(self.run_dir_spec) if main else None  # the folder's lock; a previous run set aside
        try:
            summary = self._train(main)
        finally:
            if main:
                self.run_folder.release()  # an overwritten run comes back unless this one is durable
        if self.stop_reason and main:
            self.run_log.warn(f"stopped at step {self.step}: {self.stop_reason}")
        return summary

    def _train(self, main: bool) -> dict:
        """train() with the run folder held: resume, open the folder, the steps, the end; returns the summary."""
        found = resume_point(self.run_dir_spec, check=main)  # checked: the checkpoint, on rank 0 the store and metrics
        if found is not None:  # loaded before the run folder is written: a misfit changes nothing there
            self.resume(found.path, verified=True)
            if main and self.run.distiller is not None:  # the teacher's stored values of the steps done again
                self.run.distiller.replay_from(self.run_dir_spec.output_dir, self.step)
        self.run_dir = Path(self.run_dir_spec.output_dir)
        if main:  # rank 0's writers: store, trackers, report
            self.run_log = open_run_dir(self.run_dir_spec, self.step, self.run_folder, found)
            self.run.train_source.read_history(self.run_log.store.prompt_history)  # a curriculum's prompt history
            self.writing = True
        metrics, losses, started = {}, [], time.perf_counter()
        try:
            with self.signals:
                self._begin_training()
                while self.step < self.spec.max_steps and self.stop_reason is None and self.interrupted_by is None:
                    self.run.callbacks.event("on_step_begin")
                    self.step += 1
                    metrics = self._train_step(self.step)
                    self._after_step(metrics)
                    if "loss" in metrics:  # a step without an informative group makes no update
                        losses.append(metrics["loss"])
                self._finish()
                summary = self._end_training(metrics, losses, time.perf_counter() - started)
        finally:
            self._close()
        return summary

    def _begin_training(self) -> None:
        """on_train_begin (and on_epoch_begin), then the evaluation before training."""
        callbacks = self.run.callbacks
        callbacks.set_step(self.step)
        callbacks.state.max_steps = self.spec.max_steps
        callbacks.event("on_train_begin")
        callbacks.event("on_epoch_begin")
        if self.step == 0 and self.evaluates:
            self._evaluate_and_log(0)

    def _train_step(self, step: int) -> dict:
        """Sample and score, learn, record: one step; rank 0 stores and logs it."""
        run, clock = self.run, PhaseClock()
        procs, learner = run.procs, run.learner
        # sample and score: this rank's prompts, G rollouts each (dynamic sampling: every round, and the rows trained)
        sampled = run.step_sampling.sample(step, clock)
        rollouts, trained = sampled.rollouts, sampled.trained
        staleness = run.engine.policy_version - rollouts.policy_version  # updates since the sampling policy
        # learn
        beta = learner.kl_controller.beta  # the KL coefficient of this step
        advantages, update = torch.empty(0), {}  # no informative group at all: no update
        if trained.completion_ids.size(0):
            rewards = sampled.trained_rewards
            if run.spec.algo.multi_objective_aggregation == "normalize_then_sum":  # TRL's GDPO (algos/multi_objective)
                rewards = normalize_then_sum(sampled.trained_per_func, run.rewards.weights, run.spec.num_generations)
            advantages, update = self._learn(trained, rewards, beta, clock)
        if KL in update:  # the adaptive controller moves beta after each step (Ziegler et al.: n_steps = N)
            learner.kl_controller.update(update[KL], n_steps=advantages.numel() * procs.world_size)
        update = {BETA: beta, **update, **sampled.metrics}
        # record: the step's metrics, and on rank 0 its rollouts in the store and its line in metrics.jsonl
        metrics = step_record(run, step, sampled, advantages, update, clock, staleness)
        sync = run.rollout_scheduler.sync_check  # an engine with its own copy of the weights checks it each step
        if procs.is_main:
            self.run_log.step(step, metrics.records, metrics.values)
            if self._on_records is not None:
                self._on_records(metrics.records)
            everyone = sampled.global_rewards  # every process's rewards
            tied = run.ties.step(step, everyone.names, everyone.per_func, everyone.combined)
            gap = sync.sync_gap_warning(step, metrics.values) if sync else None  # an engine's own weights
            for warning in (tied, gap):
                if warning:
                    self.run_log.warn(warning)
        if sync:
            sync.sync_gap_stop(step, metrics.values)  # every rank: the same mean gap
        return metrics.values

    def _learn(self, rollouts, rewards: torch.Tensor, beta: float, clock: PhaseClock) -> tuple[torch.Tensor, dict]:
        """Reference log-probs, the algorithm's advantages (``algos/algorithms.py``) and the learner's update on this
        rank's ``rollouts``; ``rewards`` [N_global] the combined rewards of every rank's, ``beta`` the step's KL
        coefficient. Returns (this rank's advantages [n] or [n, T]; the update's metrics, averaged over ranks)."""
        run, procs, learner = self.run, self.run.procs, self.run.learner
        inputs = update_inputs(run.update_inputs_spec, rollouts, run.device)
        loss_mask, old_logprobs = inputs.loss_mask, inputs.old_logprobs
        if run.distiller is not None:  # a served teacher's request runs beside the passes below
            run.distiller.start(rollouts)
        batch = build_batch(run.model, rollouts, run.tokenizer.pad_token_id, run.device)
        ref_logprobs = learner.reference_logprobs(batch)
        if old_logprobs is None and run.algorithm.needs_old_logprobs(self.spec.algo):
            old_logprobs = learner.old_logprobs(batch)
        old_values = learner.values(batch)  # [n, T] with a critic, else None
        n = rollouts.completion_ids.size(0)
        rows = slice(procs.rank * n, (procs.rank + 1) * n)  # this rank's rows of the global batch
        found = run.algorithm.advantages(
            AdvantageInputs(
                rewards,
                self.spec.num_generations,
                rows,
                loss_mask,
                old_logprobs=old_logprobs,
                ref_logprobs=ref_logprobs,
                values=old_values,
                beta=beta,
            ),
            self.spec.algo,
        )
        loss_mask = loss_mask if found.loss_mask is None else found.loss_mask
        distilled = {}  # on-policy distillation: the teacher's term in each token's advantage (train/teacher/)
        if run.distiller is not None:
            found, distilled = run.distiller.adjust(found, rollouts, old_logprobs, loss_mask)
        # DDP averages gradients over ranks, so dapo's per-rank denominator is the global token count / ranks.
        num_items = procs.sum(loss_mask.sum()).clamp(min=1.0) / procs.world_size
        clock.lap("logprobs")
        update = learner.update(
            batch,
            found.advantages,
            loss_mask,
            ref_logprobs,
            old_logprobs=old_logprobs,
            num_items_in_batch=num_items,
            sampling_logprobs=inputs.sampling_logprobs,
            old_values=old_values,
            returns=found.returns,
            keep_token_values=bool(self.spec.token_values),
            teacher_topk=None if run.distiller is None else run.distiller.take_topk(),
        )
        update = procs.mean_metrics(update | found.metrics) | distilled
        run.engine.sync_weights()  # the engine samples from the updated weights next step
        clock.lap("update")
        return found.per_sequence.float().cpu(), update

    def _after_step(self, metrics: dict) -> None:
        """Reference resync, stop rules, callbacks, then log, evaluate and checkpoint when due."""
        run, spec, step, callbacks = self.run, self.spec, self.step, self.run.callbacks
        if spec.ref_model_sync_steps and run.reference is not None and step % spec.ref_model_sync_steps == 0:
            run.reference.sync(spec.ref_model_mixup_alpha)
        self.stop_reason = run.stop_rules.check(metrics) or self.stop_reason
        callbacks.set_step(step)
        control = callbacks.event("on_step_end")  # a callback may ask for a log, an evaluation, a checkpoint, the end
        self._unlogged.append(trl_names(metrics))
        if step % spec.logging_steps == 0 or control.should_log:  # TRL's entry: the steps since the last, averaged
            callbacks.log(window_log(self._unlogged))
            self._unlogged = []
        if (callbacks.due("eval", step) and self.evaluates) or (control.should_evaluate and run.eval_sets):
            self._evaluate_and_log(step)
        if (callbacks.due("save", step) and step < spec.max_steps) or control.should_save:
            self._save_checkpoint()
        if step % run.steps_per_epoch == 0:
            callbacks.event("on_epoch_end")
            if step < spec.max_steps:
                callbacks.event("on_epoch_begin")
        if callbacks.control.should_training_stop and self.stop_reason is None:
            self.stop_reason = "a callback set control.should_training_stop"

    def _finish(self) -> None:
        """Last checkpoint, evaluation and final model (every rank calls it: FSDP gathers the weights).
        Stopped by a signal: only the checkpoint of the last finished step, if it is not on disk yet."""
        run = self.run
        if self.step > run.run_state.saved_step and (self.spec.save_at_end or self.interrupted_by is not None):
            self._save_checkpoint()
        if self.interrupted_by is not None:
            self.stop_reason = stop_message(self.interrupted_by, self.step)
            return
        if self.evaluates and not run.callbacks.due("eval", self.step):
            self._evaluate_and_log(self.step)
        merged = run.use_lora and self.spec.merge_on_save
        save_final_model(self.run_dir / "final", run.model, run.tokenizer, run.procs.is_main, merged)
        if run.procs.is_main:
            self.run_folder.durable()  # a run that saves no checkpoint is durable once its final model is

    def _end_training(self, metrics: dict, losses: list[float], seconds: float) -> dict:
        """TRL's closing log entry (with, as TRL's, the averaged metrics of the steps no entry has logged yet), a
        summary line on rank 0, on_train_end; returns the entry."""
        callbacks = self.run.callbacks
        summary = train_summary(losses, self.spec.completions_per_step, seconds)
        if self._unlogged:
            summary |= window_log(self._unlogged)
            self._unlogged = []
        if self.step % self.run.steps_per_epoch:  # on_epoch_end for an epoch the run ended inside, as transformers
            callbacks.event("on_epoch_end")
        if self.run.procs.is_main:
            callbacks.log(summary)
            self.run_log.summary(self.step, summary, metrics)
        callbacks.event("on_train_end")
        return summary | {"epoch": callbacks.state.epoch}

    def _close(self) -> None:
        """Close what the run opened, whatever stopped it: run folder writers (report.html), reward workers (a later
        evaluate() starts them again) and Ray rollout workers."""
        if self.run.procs.is_main:
            self.run_log.close()
            self.writing = False
        self.run.rollout_scheduler.close()  # first: its scoring threads may be calling the rewards
        self.run.rewards.close()
        if self.run.distiller is not None:
            self.run.distiller.close()
        if self.run.evaluator.reward_runner is not self.run.rewards:  # eval_rewards: evaluation's own
            self.run.evaluator.reward_runner.close()

    # ---- evaluation and checkpoints --------------------------------------------------------
    @property
    def evaluates(self) -> bool:
        """Whether the run evaluates: an eval set and an eval_strategy that evaluates."""
        return bool(self.run.eval_sets) and self.run.callbacks.every("eval") > 0

    def evaluate(self, sets: dict | None = None, prefix: str = "eval") -> dict:
        """Evaluate ``sets`` (default the run's eval sets) and log each (``train/evaluation.py``); during training the
        run folder keeps them too. Returns every set's TRL-named metrics."""
        run_log = self.run_log if self.writing else None
        return log_evaluations(self.run, sets or self.run.eval_sets, self.step, prefix, run_log)

    def _evaluate_and_log(self, step: int) -> None:
        """Rank 0 evaluates; under FSDP the other ranks make padding forward calls in lockstep with its own."""
        self.run.rollout_scheduler.settle()  # batches sampled ahead: their threads share the tokenizer and rewards
        with self.run.procs.lockstep(self.run.model):
            if self.run.procs.is_main:
                self._evaluate_in_training()

    def _save_checkpoint(self) -> None:
        """Rank 0 writes (after flushing the store and metrics.jsonl to disk, which the checkpoint records); under FSDP
        every rank joins to gather the weights and optimizer state."""
        run = self.run
        record = self.run_log.seal() if run.procs.is_main else None
        if run.run_state.save(self.run_dir, self.step, record):
            if run.procs.is_main:
                self.run_folder.durable()  # the first checkpoint: an overwritten run can go now
            run.callbacks.event("on_save")

    def resume(self, path: str | Path, verified: bool = False) -> None:
        """Restore weights, optimizer, scheduler, RNG streams and data position from a checkpoint folder (checked
        against its manifest first unless ``verified``)."""
        self.step = self.run.run_state.load(path, verified=verified) if verified else self.run.run_state.load(path)
        self.run.callbacks.set_step(self.step)
