"""transformers ``TrainerCallback``s in grpokit's loop, with a ``TrainerState`` and ``TrainerControl`` as in TRL.

The trainer fires the events transformers' Trainer fires, at the matching points of a grpokit step:
on_init_end, on_train_begin, on_epoch_begin, on_step_begin, on_step_end, on_log, on_evaluate,
on_save, on_epoch_end, on_train_end (not the micro-batch ones: on_substep_end, on_pre_optimizer_step,
on_optimizer_step, which run inside the learner). A callback may return a ``TrainerControl``; its
``should_log`` / ``should_evaluate`` / ``should_save`` set at on_step_end add a log, an evaluation or a
checkpoint at that step, and ``should_training_stop`` ends the run after the step, with its final
checkpoint, as in transformers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from grpokit.eval.settings import EvalSettings
    from grpokit.train.learning.update_settings import UpdateSettings
    from grpokit.train.rundir.settings import CheckpointSettings
    from grpokit.train.tracking_settings import TrackingSettings


class CallbackRunner:
    """The run's callbacks, ``state`` (global_step, max_steps, epoch, log_history ...) and ``control``.

    When the run logs (``tracking.logging_steps``), evaluates (``evaluation.eval_strategy`` / ``eval_steps``) and
    saves (``checkpoints.save_strategy`` / ``save_steps``); ``batch.per_device_train_batch_size`` for the
    TrainerState. ``args``: the user's config object, passed unread to every event as transformers passes its
    TrainingArguments."""

    def __init__(
        self,
        callbacks: list | None,
        *,
        tracking: TrackingSettings,
        evaluation: EvalSettings,
        checkpoints: CheckpointSettings,
        batch: UpdateSettings,
        args: Any,
        max_steps: int,
        steps_per_epoch: int,
        is_main: bool,
        **objects: Any,
    ):
        from transformers.trainer_callback import TrainerControl, TrainerState

        self.callbacks = []
        for cb in callbacks or []:
            self.add(cb)
        self.evaluation, self.checkpoints, self.args = evaluation, checkpoints, args
        self.objects = objects  # model, processing_class, optimizer, lr_scheduler: passed to every event
        self.steps_per_epoch = steps_per_epoch
        self.state = TrainerState(
            max_steps=max_steps,
            logging_steps=tracking.logging_steps,
            eval_steps=evaluation.eval_steps,
            save_steps=checkpoints.save_steps,
            train_batch_size=batch.per_device_train_batch_size,
            num_train_epochs=-(-max_steps // steps_per_epoch),
            is_local_process_zero=is_main,
            is_world_process_zero=is_main,
        )
        self.control = TrainerControl()

    def add(self, callback: Any) -> None:
        """A callback instance, or a class (instantiated without arguments, as transformers does)."""
        self.callbacks.append(callback() if isinstance(callback, type) else callback)

    def set_step(self, step: int) -> None:
        self.state.global_step = step
        self.state.epoch = step / self.steps_per_epoch

    def every(self, kind: str) -> int:
        """Steps between evaluations (``kind="eval"``) or checkpoints (``"save"``) of the run's ``eval_strategy`` /
        ``save_strategy`` (steps: eval_steps / save_steps; epoch: the steps per epoch); 0: never (no)."""
        if kind == "eval":
            strategy, every = self.evaluation.eval_strategy, self.evaluation.eval_steps
        else:
            strategy, every = self.checkpoints.save_strategy, self.checkpoints.save_steps
        if strategy == "epoch":
            every = self.steps_per_epoch
        return every if strategy != "no" and every > 0 else 0

    def due(self, kind: str, step: int) -> bool:
        """Whether ``step`` is an evaluation (``kind="eval"``) or checkpoint (``"save"``) step (:meth:`every`)."""
        every = self.every(kind)
        return every > 0 and step % every == 0

    def event(self, name: str, **kwargs: Any):
        """Call ``name`` on every callback; a returned TrainerControl replaces the current one."""
        if name == "on_step_begin":  # a new step starts with no pending request, as in transformers
            self.control.should_log = self.control.should_evaluate = self.control.should_save = False
        if name == "on_epoch_begin":
            self.control.should_epoch_stop = False
        for cb in self.callbacks:
            result = getattr(cb, name, None)
            if result is None:
                continue
            result = result(
                self.args,
                self.state,
                self.control,
                **self.objects,
                train_dataloader=None,
                eval_dataloader=None,
                **kwargs,
            )
            if result is not None:
                self.control = result
        return self.control

    def log(self, logs: dict) -> None:
        """Add the epoch to ``logs``, append them with the step to ``state.log_history``, fire on_log."""
        logs = {**{k: v for k, v in logs.items() if isinstance(v, (int, float))}, "epoch": self.state.epoch}
        self.state.log_history.append({**logs, "step": self.state.global_step})
        self.event("on_log", logs=logs)
