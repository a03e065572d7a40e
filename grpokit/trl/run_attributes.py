"""TRL's and grpokit's attributes of a trainer, each an explicit, typed, read-only property over the built
:class:`~grpokit.compose.Run` or the :class:`~grpokit.train.loop.Loop` (no ``__getattr__``: editors and type checkers
see every name). The Run is frozen, so its parts cannot be replaced after the build: assigning one raises
AttributeError. The few attributes TRL's tests set on a trainer made with ``object.__new__`` (``model``,
``processing_class``, ``tools``, ``accelerator``, ``state``) have setters in :mod:`grpokit.trl.trainer`, which
refuse a built trainer."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from grpokit.eval.evaluator import Evaluator
from grpokit.kernels import Kernels
from grpokit.train.callbacks import CallbackRunner
from grpokit.train.loop_spec import LoopSpec
from grpokit.train.rundir.checkpoint import RunState
from grpokit.train.stopping import StopRules

if TYPE_CHECKING:
    from grpokit.algos.algorithms import Algorithm
    from grpokit.compose import Run
    from grpokit.config import GRPOConfig
    from grpokit.data.prompts import PromptSource
    from grpokit.rewards.runner import RewardRunner
    from grpokit.system.processes import SingleProcess
    from grpokit.train.experience.rollout_scheduler import RolloutScheduler
    from grpokit.train.experience.rounds import SingleRound
    from grpokit.train.learning.learner import Learner, UpdateInputsSpec
    from grpokit.train.learning.reference import Reference
    from grpokit.train.loop import Loop
    from grpokit.train.rundir.folder import RunDirSpec
    from grpokit.train.ties import TieWatch


class RunAttributes:
    """The Run's parts (``trainer.learner``, ``trainer.engine`` ...) and the loop's progress (``trainer.step`` ...)."""

    run: Run
    loop: Loop

    @property
    def config(self) -> GRPOConfig:
        """The resolved config (max_steps resolved); TRL's ``trainer.args`` is the same object."""
        return self.run.config

    @property
    def spec(self) -> LoopSpec:
        """The loop's own settings (:class:`~grpokit.train.loop_spec.LoopSpec`)."""
        return self.run.spec

    @property
    def procs(self) -> SingleProcess:
        """This run's processes (one process, or a torchrun rank)."""
        return self.run.procs

    @property
    def train_dataset(self) -> Any:
        """The training dataset as given (TRL's attribute)."""
        return self.run.train_dataset

    @property
    def train_rows(self) -> list[dict]:
        """The training rows, read once."""
        return self.run.train_rows

    @property
    def eval_sets(self) -> dict:
        """``{name (None: the one eval_dataset): (PromptSource, rows)}``."""
        return self.run.eval_sets

    @property
    def rewards(self) -> RewardRunner:
        """The reward runner."""
        return self.run.rewards

    @property
    def steps_per_epoch(self) -> int:
        """Steps per pass over the training rows."""
        return self.run.steps_per_epoch

    @property
    def device(self) -> torch.device:
        """The learner's device."""
        return self.run.device

    @property
    def use_lora(self) -> bool:
        """Whether the policy trains LoRA adapters."""
        return self.run.use_lora

    @property
    def autocast_dtype(self) -> torch.dtype | None:
        """The compute dtype of the autocast regions, or None (the weights' dtype)."""
        return self.run.autocast_dtype

    @property
    def kernels(self) -> Kernels:
        """The run's choice of CPU kernels."""
        return self.run.kernels

    @property
    def train_source(self) -> PromptSource:
        """The training prompt source."""
        return self.run.train_source

    @property
    def rollout_scheduler(self) -> RolloutScheduler:
        """What samples and scores each step's rollouts."""
        return self.run.rollout_scheduler

    @property
    def update_inputs_spec(self) -> UpdateInputsSpec:
        """How a step's rollouts become the learner's inputs."""
        return self.run.update_inputs_spec

    @property
    def step_sampling(self) -> SingleRound:
        """One round of sampling per step, or DAPO's dynamic sampling."""
        return self.run.step_sampling

    @property
    def algorithm(self) -> Algorithm:
        """The algorithm's registry entry."""
        return self.run.algorithm

    @property
    def reference(self) -> Reference | None:
        """The reference policy, or None."""
        return self.run.reference

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        """The policy's optimizer (TRL's ``trainer.optimizer``)."""
        return self.run.optimizer

    @property
    def scheduler(self) -> torch.optim.lr_scheduler.LRScheduler:
        """The learning-rate schedule."""
        return self.run.scheduler

    @property
    def learner(self) -> Learner:
        """The policy update."""
        return self.run.learner

    @property
    def evaluator(self) -> Evaluator:
        """pass@k over the eval sets."""
        return self.run.evaluator

    @property
    def stop_rules(self) -> StopRules:
        """The run's stop rules."""
        return self.run.stop_rules

    @property
    def ties(self) -> TieWatch | None:
        """The tie warning's watch."""
        return self.run.ties

    @property
    def callbacks(self) -> CallbackRunner:
        """TRL's TrainerCallbacks and their TrainerState."""
        return self.run.callbacks

    @property
    def run_state(self) -> RunState:
        """What a checkpoint saves and restores."""
        return self.run.run_state

    @property
    def run_dir_spec(self) -> RunDirSpec:
        """The run folder's settings."""
        return self.run.run_dir_spec

    @property
    def engine(self) -> Any:
        """The rollout engine sampling in this process (HF or vLLM)."""
        return self.run.engine

    @property
    def entropy_coef(self) -> float:
        """TRL's ``trainer.entropy_coef``: the entropy bonus's coefficient now (adaptive control moves it)."""
        return self.run.learner.terms.entropy_coef

    @property
    def aux_loss_enabled(self) -> bool:
        """TRL's ``trainer.aux_loss_enabled``: whether the router's load-balancing loss is in the objective."""
        return self.run.learner.terms.aux_loss_enabled

    @property
    def step(self) -> int:
        """The last step trained (0 before training)."""
        return self.loop.step

    @property
    def stop_reason(self) -> str | None:
        """Why the run stopped before max_steps (a stop rule), or None."""
        return self.loop.stop_reason

    @property
    def interrupted_by(self) -> int | None:
        """The signal that stopped training, or None."""
        return self.loop.interrupted_by

    @property
    def run_dir(self) -> Path:
        """The run folder (set when training starts)."""
        return self.loop.run_dir

    @property
    def run_log(self) -> Any:
        """The run folder's writer: metrics.jsonl, the store, the report (set when training starts)."""
        return self.loop.run_log

    @property
    def run_folder(self) -> Any:
        """The run folder's lock and set-aside previous run (the main process, while training)."""
        return self.loop.run_folder

    @property
    def signals(self) -> Any:
        """The signal handling that turns SIGINT / SIGTERM into a checkpoint and a clean stop."""
        return self.loop.signals
