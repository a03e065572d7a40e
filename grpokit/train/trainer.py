"""The GRPO training loop.

One step (docs/architecture.md): RolloutScheduler.next (prompts, G rollouts each) -> RewardRunner.score -> reference
log-probs (and the critic's values) -> the algorithm's advantages -> Learner.update -> RolloutStore.write_step ->
Tracker.log; evaluation every eval_steps, checkpoints every save_steps. Every torchrun rank runs this
same loop; rank 0 alone owns the run folder.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from grpokit.algos.names import BETA, KL
from grpokit.algos.registry import AdvantageInputs, get_algorithm
from grpokit.algos.token_masks import high_entropy_mask, off_policy_sequence_mask
from grpokit.config import GRPOConfig
from grpokit.config.training import AlgoConfig
from grpokit.data.prompts import is_streaming, reward_arguments
from grpokit.eval.evaluator import Evaluator
from grpokit.hardware import autocast_dtype
from grpokit.hub import HubSpec
from grpokit.kernels import Kernels
from grpokit.modeling import ensure_pad_token
from grpokit.rewards.contract import RewardState
from grpokit.rewards.judge import ClassifierReward
from grpokit.rollout.types import SamplingParams
from grpokit.store.record import rollout_records
from grpokit.train import setup, specs
from grpokit.train.accelerator import ProcessAccelerator
from grpokit.train.callbacks import CallbackRunner
from grpokit.train.checkpoint import RunState, save_final_model, save_model_files
from grpokit.train.dynamic_sampling import renumber_repeats
from grpokit.train.interrupt import SignalStop, stop_message
from grpokit.train.learner import update_inputs
from grpokit.train.logprobs import build_batch
from grpokit.train.metrics import (
    EVAL,
    PhaseClock,
    sample_metrics,
    step_metrics,
    stored_eval_names,
    train_summary,
    trl_eval_names,
    trl_names,
    window_log,
)
from grpokit.train.run_dir import RunFolder, open_run_dir, resume_point
from grpokit.train.stopping import StopRules
from grpokit.train.trajectory import Trajectory


@dataclass(frozen=True)
class LoopSpec:
    """The training loop's own settings, built once by the composition root (:func:`grpokit.train.specs.loop_spec`):
    the model's name (None: a module was given), ``dtype``, ``seed``; the ``algorithm`` and its section (``algo``,
    read by the algorithm's advantages); G (``num_generations``), ``max_steps`` (resolved), the global
    ``completions_per_step``; the dataset's ``prompt_column``; ``rewards_on_main`` (Ray reward workers: rank 0
    scores every rank's rows); the reference resync (``ref_model_sync_steps``, ``ref_model_mixup_alpha``);
    ``logging_steps``; ``save_at_end`` (save_strategy is not no) and ``merge_on_save``."""

    model_name_or_path: str | None
    dtype: str
    seed: int
    algorithm: str
    algo: AlgoConfig
    num_generations: int
    max_steps: int
    completions_per_step: int
    prompt_column: str = "prompt"
    rewards_on_main: bool = False
    ref_model_sync_steps: int = 0
    ref_model_mixup_alpha: float = 0.6
    logging_steps: int = 1
    save_at_end: bool = True
    merge_on_save: bool = False
    eval_dataset: Any = None
    hub: HubSpec | None = None


_PADDING = -1e9  # pads masked entropies (>= 0) to the same length on every process before a gather


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
    ``tools`` (functions) and ``environment_factory`` (a class or factory, or ``{name: factory}``) make rollouts
    multi-turn conversations with tool calls (docs/tools.md); they replace the config's ``agent.tools`` /
    ``agent.environment_factory``. ``eval_dataset`` may be a dict of datasets (or a ``DatasetDict``), each
    evaluated on its own as in TRL. ``rollout_func`` (TRL's, ``fn(prompts, trainer) -> dict``) generates the
    completions instead of grpokit's sampler, in training and evaluation (:mod:`grpokit.rollout.rollout_func`,
    docs/from_trl.md): it receives each prompt ``num_generations`` times, adjacent, and returns one completion each.

    What ``trainer.state.log_history``, the callbacks and ``evaluate()`` see is named as in TRL
    (``completions/mean_length``, ``eval_reward`` ...: ``train/metrics.py``'s ``TRL_NAMES``); metrics.jsonl, the
    store and the console keep grpokit's names.
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
        tools: list | None = None,
        environment_factory: Any = None,
        rollout_func: Any = None,
    ):
        self.rollout_func = rollout_func  # TRL's: called by _generate, which the rollout_func engine calls
        args, tokenizer = setup.trainer_arguments(args, peft_config, processing_class, tokenizer)
        procs = self.procs = setup.run_processes()  # rank and world size under torchrun; one process otherwise
        # Everything that can be checked without a model is checked first.
        inputs = setup.check_inputs(
            args,
            procs,
            train_dataset,
            eval_dataset,
            reward_funcs,
            reward_processing_classes,
            tools,
            environment_factory,
            rollout_func,
        )
        self.args = args = inputs.args  # the user's GRPOConfig (max_steps resolved), as TRL's trainer.args
        self.train_rows, eval_rows, self.rewards = inputs.train_rows, inputs.eval_sets, inputs.rewards
        self.train_dataset = train_dataset  # as given (TRL's attributes)
        spec = self.spec = specs.loop_spec(args, procs.world_size)  # the loop's own settings
        self.eval_dataset = eval_dataset if eval_dataset is not None else spec.eval_dataset
        self.steps_per_epoch = inputs.steps_per_epoch
        self.run_dir_spec = specs.run_dir_spec(args)
        # The policy, its prompts, how it samples and how it learns.
        path = model if isinstance(model, str) else spec.model_name_or_path if model is None else None
        if path and procs.is_main:
            setup.warn_if_too_big(args, path)
        model, tokenizer, device, self.use_lora = setup.build_policy(model, tokenizer, args, peft_config)
        self.model, self.tokenizer, self.device = model, tokenizer, device
        ensure_pad_token(tokenizer)
        # the eval sets by name (None: the one eval_dataset): (PromptSource, rows)
        self.train_source, self.eval_sets = setup.prompt_sources(args, tokenizer, self.train_rows, eval_rows)
        torch.manual_seed(spec.seed)
        self.autocast_dtype = autocast_dtype(spec.dtype, device, model)
        self.kernels = Kernels.select(device, self.autocast_dtype)  # this run's fast paths, chosen once
        self.rollout_scheduler, self.update_inputs_spec = setup.build_rollouts(
            args,
            model=model,
            tokenizer=tokenizer,
            prompts=self.train_source,
            procs=procs,
            device=device,
            autocast_dtype=self.autocast_dtype,
            source=path,
            kernels=self.kernels,
            tools=inputs.tools,
            rollout_func=None if rollout_func is None else self._generate,
        )
        self.step_sampling = setup.build_step_sampling(
            args, self.rollout_scheduler, self._score, tokenizer.pad_token_id
        )  # one round per step, or dynamic sampling's rounds
        self.algorithm = get_algorithm(spec.algorithm)  # what the steps ask for advantages (algos/registry.py)
        self.reference, self.optimizer, self.scheduler, self.learner = setup.build_learner(
            model,
            args,
            procs=procs,
            device=device,
            use_lora=self.use_lora,
            optimizers=optimizers,
            autocast_dtype=self.autocast_dtype,
            kernels=self.kernels,
            prompt_tokens=self.train_source.longest,
        )
        # The run around the steps: evaluation, stop rules, checkpoints, signals, callbacks.
        self.evaluator = Evaluator(
            specs.eval_spec(args),
            engine=self.engine,
            tokenizer=tokenizer,
            reward_runner=self.rewards,
            params=self.sampling,
            tools=self.rollout_scheduler.tool_rollouts,
        )
        self.step = 0
        self.stop_reason: str | None = None
        self.stop_rules = StopRules(specs.stop_spec(args))  # non-finite steps, KL over max_kl
        # a warning when every group ties for warn_tied_steps steps (a group-relative advantage learns nothing)
        self.ties = specs.tie_watch(args, group_relative=not self.algorithm.uses_critic)
        self._writing = False  # rank 0 while train() runs: evaluations go to the run folder too
        self._unlogged: list[dict] = []  # TRL-named metrics of the steps since the last log entry
        self.callbacks = CallbackRunner(
            callbacks,
            specs.callback_spec(args),
            args=args,  # passed to the callbacks' events, as transformers passes its TrainingArguments
            max_steps=spec.max_steps,
            steps_per_epoch=self.steps_per_epoch,
            is_main=procs.is_main,
            model=model,
            processing_class=tokenizer,
            optimizer=self.optimizer,
            lr_scheduler=self.scheduler,
        )
        # what a checkpoint saves and a resume restores
        self.run_state = RunState(
            specs.checkpoint_spec(args),
            model=model,
            learner=self.learner,
            data=self.train_source,
            rollouts=self.rollout_scheduler,
            stop_rules=self.stop_rules,
            is_main=procs.is_main,
            trainer_state=lambda: self.state,  # log_history and num_input_tokens_seen, as TRL's checkpoints
        )
        self.signals = SignalStop(lambda: (self.step, self.run_state.saved_step), enabled=procs.is_main)
        self.callbacks.event("on_init_end")

    @property
    def state(self):
        """The run's transformers ``TrainerState`` (TRL's ``trainer.state``): global_step, max_steps, epoch,
        num_input_tokens_seen, log_history. Settable, as in TRL (the callbacks then see the new one)."""
        callbacks = self.__dict__.get("callbacks")
        return callbacks.state if callbacks is not None else self.__dict__.get("_state")

    @state.setter
    def state(self, value) -> None:
        callbacks = self.__dict__.get("callbacks")
        if callbacks is not None:
            callbacks.state = value
        else:  # a trainer not built by __init__ (TRL's tests make one with object.__new__)
            self.__dict__["_state"] = value

    @property
    def processing_class(self):
        """The tokenizer (TRL's name for it); settable."""
        return self.tokenizer

    @processing_class.setter
    def processing_class(self, value) -> None:
        self.tokenizer = value

    @property
    def ref_model(self):
        """TRL's ``trainer.ref_model``: the frozen reference copy, or None (beta = 0, or LoRA, whose reference is
        the policy with its adapters off: TRL's is None then too)."""
        return None if self.reference is None else self.reference.model

    @property
    def eval_rows(self) -> list[dict] | None:
        """The rows of the one eval dataset (None without one, or with a dict of them)."""
        found = self.eval_sets.get(None)
        return None if found is None else found[1]

    @property
    def engine(self):
        """The rollout engine sampling in this process (HF or vLLM)."""
        return self.rollout_scheduler.engine

    @property
    def sampling(self) -> SamplingParams:
        return self.rollout_scheduler.sampling

    # ---- TRL's reward and environment attributes (read-only views of the reward runner and the tool rollouts) ----
    @property
    def reward_funcs(self) -> list:
        """The reward functions in scoring order (a reward model as its ``nn.Module``; environments' ``get_reward``
        last), as TRL's ``trainer.reward_funcs``."""
        return [fn.model if isinstance(fn, ClassifierReward) else fn for fn in self.rewards.functions]

    @property
    def reward_func_names(self) -> list[str]:
        """Each reward function's name, as in the ``rewards/<name>/mean`` metrics."""
        return list(self.rewards.names)

    @property
    def reward_weights(self) -> torch.Tensor:
        """The weights of the reward functions [F], float32 as in TRL."""
        return self.rewards.weights.to(torch.float32)

    @property
    def reward_processing_classes(self) -> list:
        """Each reward function's tokenizer (a reward model's, given or loaded from its folder) or None."""
        return [getattr(fn, "processing_class", None) for fn in self.rewards.functions]

    @property
    def tools(self) -> list:
        """The run's tools: the plain ones, then each environment's methods (of its first instance), as TRL's."""
        if "_tools" in self.__dict__:
            return self.__dict__["_tools"]
        scheduler = self.rollout_scheduler
        return [] if scheduler.tool_rollouts is None else scheduler.tool_rollouts.spec.all_tools()

    @tools.setter
    def tools(self, value) -> None:
        """Settable only on a trainer not built by ``__init__`` (TRL's tests make one with ``object.__new__``); a
        built trainer's tools are its rollouts', fixed when it was built."""
        if "rollout_scheduler" in self.__dict__:
            raise AttributeError("trainer.tools is fixed when the trainer is built; pass tools=... to GRPOTrainer.")
        self.__dict__["_tools"] = value

    @property
    def environments(self) -> list | None:
        """The environment instances of the last sampled rollouts, in order (None without environments)."""
        tool_rollouts = self.rollout_scheduler.tool_rollouts
        return None if tool_rollouts is None else tool_rollouts.environments

    @property
    def interrupted_by(self) -> int | None:
        """The signal that stopped training (None: none did)."""
        return self.signals.signum

    @property
    def accelerator(self) -> ProcessAccelerator:
        """TRL's ``trainer.accelerator``: this run's processes (rank, count, gather, reduce), as accelerate answers.
        Settable, as TRL's attribute (a test's stand-in); what reads it (``get_high_entropy_mask``) then uses that."""
        given = self.__dict__.get("_accelerator")
        return given if given is not None else ProcessAccelerator(self.procs, self.device)

    @accelerator.setter
    def accelerator(self, value) -> None:
        self.__dict__["_accelerator"] = value

    def _generate(self, prompts: list):
        """TRL's ``_generate`` on its rollout_func path: ``self.rollout_func(prompts, self)`` on a copy of ``prompts``
        (the function may change it), its dict checked (:func:`grpokit.rollout.rollout_func.check_output`: TRL's
        ValueError "rollout_func must return keys [...] in its output dict." for a missing key, one entry per prompt
        in every list) and returned as a ``RolloutFuncOutput`` (prompt_ids, completion_ids, env_mask, logprobs,
        extra). The rollout_func engine calls it with each prompt num_generations times; grpokit's own sampler does
        not come through here."""
        import copy

        from grpokit.rollout.rollout_func import check_output

        if self.rollout_func is None:
            raise RuntimeError("_generate calls rollout_func, and this trainer has none; GRPOTrainer(rollout_func=fn).")
        prompts = copy.deepcopy(prompts)
        return check_output(self.rollout_func(prompts, self), len(prompts))

    def add_callback(self, callback: Any) -> None:
        """Add a ``TrainerCallback`` (instance or class), as ``transformers.Trainer.add_callback``."""
        self.callbacks.add(callback)

    # ---- transformers' Trainer data loaders (grpokit's loop draws its prompts from its own PromptSource) ----
    def get_train_dataloader(self) -> torch.utils.data.DataLoader:
        """A DataLoader over the training rows as Trainer gives it: ``per_device_train_batch_size`` rows a batch,
        ``dataloader_num_workers`` workers (0 for a streaming dataset). For code that reads the data the Trainer
        way; training itself samples its prompts from the seeded, resumable prompt source."""
        return setup.rows_loader(self.args, self.train_rows, train=True, streaming=is_streaming(self.train_dataset))

    def get_eval_dataloader(self, eval_dataset: Any = None) -> torch.utils.data.DataLoader:
        """A DataLoader over an eval set's rows: ``eval_dataset`` None (the one eval dataset), a name of a dict of
        them, or a dataset. A streaming set is read by one worker (0), whatever ``dataloader_num_workers`` says."""
        if eval_dataset is None or isinstance(eval_dataset, str):
            name, given = eval_dataset, self.eval_dataset
            given = given[name] if name is not None and isinstance(given, Mapping) else given
            rows = self.eval_sets[name][1]
        else:
            given, rows = eval_dataset, setup.eval_sets(eval_dataset, self.spec.prompt_column)[None]
        return setup.rows_loader(self.args, rows, train=False, streaming=is_streaming(given))

    # ---- TRL's helpers (their math is in algos/token_masks.py) ---------------------------------
    def get_high_entropy_mask(self, entropies: torch.Tensor, mask: torch.Tensor, threshold: float) -> torch.Tensor:
        """TRL's helper: [N, T] bool, the masked tokens whose entropy is at least the ``threshold``-quantile of every
        process's masked entropies (``algos.token_masks.high_entropy_mask``; ``top_entropy_quantile`` uses
        threshold = 1 - top_entropy_quantile). Reads only ``self.accelerator``'s ``pad_across_processes`` and
        ``gather``."""
        accelerator = self.accelerator

        def gather(values: torch.Tensor) -> torch.Tensor:
            everyone = accelerator.gather(accelerator.pad_across_processes(values, dim=0, pad_index=_PADDING))
            return everyone[everyone != _PADDING]  # entropies are >= 0, so the padding is told apart

        return high_entropy_mask(entropies, mask, threshold, gather)

    @staticmethod
    def get_off_policy_mask(
        advantages: torch.Tensor,
        per_token_logps: torch.Tensor,
        sampling_per_token_logps: torch.Tensor,
        mask: torch.Tensor,
        off_policy_threshold: float,
    ) -> torch.Tensor:
        """TRL's helper: [N, 1], 0 for the sequences with A < 0 whose mean log(mu / pi) exceeds the threshold
        (``algos.token_masks.off_policy_sequence_mask``; ``off_policy_mask_threshold``), 1 for the others."""
        return off_policy_sequence_mask(
            advantages, per_token_logps, sampling_per_token_logps, mask, off_policy_threshold
        )

    # ---- the loop --------------------------------------------------------------------------
    def train(self, resume_from_checkpoint: str | bool | None = None):
        """Train to max_steps (or until stopped); returns transformers' ``TrainOutput(global_step, training_loss,
        metrics)`` as TRL does (metrics: train_runtime, train_samples_per_second, train_steps_per_second,
        train_loss, epoch; about the steps run in this call). Every rank runs this loop (metrics are averaged
        over ranks, so every rank stops together); rank 0 alone writes the run folder, evaluates and saves
        (other ranks join in only to gather FSDP-sharded weights).

        ``resume_from_checkpoint`` (TRL's argument): True = the latest checkpoint of output_dir, or a checkpoint folder;
        a new trainer on the run's output_dir continues it from there, ``trainer.state.log_history`` included. An
        output_dir that holds a run is refused here unless told to resume it (or ``overwrite``).
        """
        main = self.procs.is_main
        if resume_from_checkpoint:
            resume = "latest" if resume_from_checkpoint is True else str(resume_from_checkpoint)
            self.run_dir_spec = self.run_dir_spec.resuming(resume)
        self.run_folder = RunFolder(self.run_dir_spec) if main else None  # the folder's lock; a previous run set aside
        try:
            summary = self._train(main)
        finally:
            if main:
                self.run_folder.release()  # an overwritten run comes back unless this one is durable
        if self.stop_reason and main:
            self.run_log.warn(f"stopped at step {self.step}: {self.stop_reason}")
        from transformers.trainer_utils import TrainOutput

        return TrainOutput(self.step, summary["train_loss"], summary)

    def _train(self, main: bool) -> dict:
        """train() with the run folder held: resume, open the folder, the steps, the end; returns the summary."""
        found = resume_point(self.run_dir_spec, check=main)  # checked: the checkpoint, on rank 0 the store and metrics
        if found is not None:  # loaded before the run folder is written: a misfit changes nothing there
            self.step = self.run_state.load(found.path, verified=True)
            self.callbacks.set_step(self.step)
        self.run_dir = Path(self.run_dir_spec.output_dir)
        if main:  # rank 0's writers: store, trackers, report
            self.run_log = open_run_dir(self.run_dir_spec, self.step, self.run_folder, found)
            self._writing = True
        metrics, losses, started = {}, [], time.perf_counter()
        try:
            with self.signals:
                self._begin_training()
                while self.step < self.spec.max_steps and self.stop_reason is None and self.interrupted_by is None:
                    metrics = self._run_step()
                    if "loss" in metrics:  # a step without an informative group makes no update
                        losses.append(metrics["loss"])
                self._finish()
                summary = self._end_training(metrics, losses, time.perf_counter() - started)
        finally:
            self._close()
        return summary

    def _begin_training(self) -> None:
        """on_train_begin (and on_epoch_begin), then the evaluation before training."""
        self.callbacks.set_step(self.step)
        self.callbacks.state.max_steps = self.spec.max_steps
        self.callbacks.event("on_train_begin")
        self.callbacks.event("on_epoch_begin")
        if self.step == 0 and self._evaluates:
            self._evaluate_and_log(0)

    def _run_step(self) -> dict:
        self.callbacks.event("on_step_begin")
        self.step += 1
        metrics = self._train_step(self.step)
        self._after_step(metrics)
        return metrics

    def _train_step(self, step: int) -> dict:
        """Rollouts, rewards, the algorithm's advantages and the update; rank 0 stores and logs the step."""
        G, procs, clock = self.spec.num_generations, self.procs, PhaseClock()
        # this rank's prompts, G rollouts each, scored (dynamic sampling: every round, and the rows trained on)
        sampled = self.step_sampling.sample(step, clock)
        rollouts = sampled.rollouts
        staleness = self.engine.policy_version - rollouts.policy_version  # updates since the sampling policy
        trained = sampled.trained
        beta = self.learner.kl_controller.beta  # the KL coefficient of this step
        advantages, update = torch.empty(0), {}  # no informative group at all: no update
        if trained.completion_ids.size(0):
            advantages, update = self._learn(trained, sampled.trained_rewards, beta, clock)
        if KL in update:  # the adaptive controller moves beta after each step (Ziegler et al.: n_steps = N)
            self.learner.kl_controller.update(update[KL], n_steps=advantages.numel() * procs.world_size)
        update = {BETA: beta, **update, **sampled.metrics}

        all_advantages = procs.gather(advantages.float())  # [N_global trained], one per completion
        all_lengths = procs.gather(rollouts.sampled_lengths.float())  # [N_global] tokens the model wrote
        prompt_tokens = procs.sum(torch.tensor(float(sum(len(self.train_source.ids[i]) for i in sampled.indices) * G)))
        all_truncated = procs.gather(rollouts.truncated.float())  # [N_global]
        state = self.state
        state.num_input_tokens_seen += int(prompt_tokens.item() + all_lengths.sum().item())  # TRL's num_tokens
        metrics = step_metrics(
            sampled.global_rewards,
            update=update,
            advantages=all_advantages,
            group_size=G,
            lengths=all_lengths,
            truncated=all_truncated,
            prompt_tokens=prompt_tokens.item(),
            source=self.train_source,
            staleness=staleness,
            times=clock.metrics(),
            extra=self.rollout_scheduler.metrics(),
            tokens_seen=state.num_input_tokens_seen,
        )
        stored = sampled.stored_advantages(advantages)  # every sampled group, the dropped ones without an advantage
        records = rollout_records(
            sampled.indices, rollouts, sampled.completions, sampled.reward, stored, self.train_source
        )
        if sampled.train_rows is not None:  # a prompt drawn again by a later round: its completions numbered on
            records = renumber_repeats(records, G)
        records = procs.gather_objects(records)  # every rank's, on rank 0
        if procs.is_main:
            self.run_log.step(step, [r for part in records for r in part], metrics)
            everyone = sampled.global_rewards  # every process's rewards
            tied = self.ties.step(step, everyone.names, everyone.per_func, everyone.combined)
            if tied:
                self.run_log.warn(tied)
        return metrics

    def _score(self, step: int, indices: list[int], rollouts) -> Trajectory:
        """This rank's ``rollouts`` of the prompts ``indices``, decoded and scored (this rank's RewardResult and
        every rank's)."""
        spec, procs = self.spec, self.procs
        prompts, completions, columns, completion_ids = reward_arguments(
            self.train_rows, indices, rollouts, self.tokenizer, spec.prompt_column
        )
        scored = completions  # tool rollouts: their messages (and environments), as TRL passes them
        if rollouts.conversations is not None:
            prompts, scored, columns = self.rollout_scheduler.tool_rollouts.reward_inputs(
                prompts, rollouts.conversations, columns
            )
        # This rank's rewards and every rank's, so groups are complete and batch-level scaling sees the whole batch.
        reward, all_rewards = procs.score_rewards(
            self.rewards,
            prompts,
            scored,
            columns,
            spec.num_generations,
            on_main=spec.rewards_on_main,
            completion_ids=completion_ids,
            trainer_state=self._reward_state(step),
        )
        return Trajectory(indices, rollouts, completions, reward, all_rewards)

    def _learn(self, rollouts, rewards: torch.Tensor, beta: float, clock: PhaseClock) -> tuple[torch.Tensor, dict]:
        """Reference log-probs, the algorithm's advantages (``algos/registry.py``) and the learner's update on this
        rank's ``rollouts``; ``rewards`` [N_global] the combined rewards of every rank's, ``beta`` the step's KL
        coefficient. Returns (this rank's advantages, one per completion [n]; the update's metrics, averaged over
        ranks)."""
        spec, procs = self.spec, self.procs
        inputs = update_inputs(self.update_inputs_spec, rollouts, self.device)
        loss_mask, old_logprobs = inputs.loss_mask, inputs.old_logprobs
        batch = build_batch(self.model, rollouts, self.tokenizer.pad_token_id, self.device)
        ref_logprobs = self.learner.reference_logprobs(batch)
        if old_logprobs is None and self.algorithm.needs_old_logprobs(spec.algo):
            old_logprobs = self.learner.old_logprobs(batch)
        old_values = self.learner.values(batch)  # [n, T] with a critic, else None
        n = rollouts.completion_ids.size(0)
        rows = slice(procs.rank * n, (procs.rank + 1) * n)  # this rank's rows of the global batch
        found = self.algorithm.advantages(
            AdvantageInputs(
                rewards,
                spec.num_generations,
                rows,
                loss_mask,
                old_logprobs=old_logprobs,
                ref_logprobs=ref_logprobs,
                values=old_values,
                beta=beta,
            ),
            spec.algo,
        )
        loss_mask = loss_mask if found.loss_mask is None else found.loss_mask
        # DDP averages gradients over ranks, so dapo's per-rank denominator is the global token count / ranks.
        num_items = procs.sum(loss_mask.sum()).clamp(min=1.0) / procs.world_size
        clock.lap("logprobs")
        update = self.learner.update(
            batch,
            found.advantages,  # [n] or [n, T]
            loss_mask,
            ref_logprobs,
            old_logprobs=old_logprobs,
            num_items_in_batch=num_items,
            sampling_logprobs=inputs.sampling_logprobs,
            old_values=old_values,
            returns=found.returns,
        )
        update = procs.mean_metrics(update | found.metrics)
        self.engine.sync_weights()  # the engine samples from the updated weights next step
        clock.lap("update")
        return found.per_sequence.float().cpu(), update

    def _after_step(self, metrics: dict) -> None:
        spec, step = self.spec, self.step
        if spec.ref_model_sync_steps and self.reference is not None and step % spec.ref_model_sync_steps == 0:
            self.reference.sync(spec.ref_model_mixup_alpha)
        reason = self.stop_rules.check(metrics)
        self.stop_reason = reason or self.stop_reason
        self.callbacks.set_step(step)
        # a callback may ask for a log, an evaluation, a checkpoint, the end
        control = self.callbacks.event("on_step_end")
        self._unlogged.append(trl_names(metrics))
        if step % spec.logging_steps == 0 or control.should_log:  # TRL's entry: the steps since the last, averaged
            self.callbacks.log(window_log(self._unlogged))
            self._unlogged = []
        if (self.callbacks.due("eval", step) and self._evaluates) or (control.should_evaluate and self.eval_sets):
            self._evaluate_and_log(step)
        if (self.callbacks.due("save", step) and step < spec.max_steps) or control.should_save:
            self._save_checkpoint()
        if step % self.steps_per_epoch == 0:
            self.callbacks.event("on_epoch_end")
            if step < spec.max_steps:
                self.callbacks.event("on_epoch_begin")
        if self.callbacks.control.should_training_stop and self.stop_reason is None:
            self.stop_reason = "a callback set control.should_training_stop"

    def _finish(self) -> None:
        """Last checkpoint, evaluation and final model (every rank calls it: FSDP gathers the weights).
        Stopped by a signal: only the checkpoint of the last finished step, if it is not on disk yet."""
        if self.step > self.run_state.saved_step and (self.spec.save_at_end or self.interrupted_by is not None):
            self._save_checkpoint()
        if self.interrupted_by is not None:
            self.stop_reason = stop_message(self.interrupted_by, self.step)
            return
        if self._evaluates and not self.callbacks.due("eval", self.step):
            self._evaluate_and_log(self.step)
        merged = self.use_lora and self.spec.merge_on_save
        save_final_model(self.run_dir / "final", self.model, self.tokenizer, self.procs.is_main, merged)
        if self.procs.is_main:
            self.run_folder.durable()  # a run that saves no checkpoint is durable once its final model is

    def _end_training(self, metrics: dict, losses: list[float], seconds: float) -> dict:
        """TRL's closing log entry (with, as TRL's, the averaged metrics of the steps no entry has logged yet), a
        summary line on rank 0, on_train_end; returns the entry."""
        summary = train_summary(losses, self.spec.completions_per_step, seconds)
        if self._unlogged:
            summary |= window_log(self._unlogged)
            self._unlogged = []
        if self.step % self.steps_per_epoch:  # on_epoch_end for an epoch the run ended inside, as transformers does
            self.callbacks.event("on_epoch_end")
        if self.procs.is_main:
            self.callbacks.log(summary)
            self.run_log.summary(self.step, summary, metrics)
        self.callbacks.event("on_train_end")
        return summary | {"epoch": self.state.epoch}

    def _close(self) -> None:
        """Close what the run opened, whatever stopped it: run folder writers (report.html), reward workers (a later
        evaluate() starts them again) and Ray rollout workers."""
        if self.procs.is_main:
            self.run_log.close()
            self._writing = False
        self.rewards.close()
        self.rollout_scheduler.close()

    # ---- evaluation and checkpoints --------------------------------------------------------
    @property
    def _evaluates(self) -> bool:
        """Whether the run evaluates: an eval set and an eval_strategy that evaluates."""
        return bool(self.eval_sets) and self.callbacks.every("eval") > 0

    def evaluate(self, eval_dataset: Any = None, ignore_keys: list | None = None, metric_key_prefix: str = "eval"):
        """TRL's ``trainer.evaluate()``: sample ``num_generations_eval`` completions of each eval prompt (and one
        greedily), score them, and return TRL's names: ``eval_reward``, ``eval_reward_std``,
        ``eval_rewards/<fn>/mean`` and ``/std``, ``eval_frac_reward_zero_std``, ``eval_completions/mean_length`` ...,
        a ``log_metric`` name as ``eval_<name>``, ``eval_runtime``, ``eval_samples_per_second``,
        ``eval_steps_per_second``, and grpokit's ``eval_pass@k`` (k in ``pass_at_k``), ``eval_greedy_accuracy``,
        ``eval_num_prompts``; with ``epoch``. A dict of eval datasets gives each its own names
        (``eval_<name>_reward`` ...). Like TRL, each dataset's metrics are a ``log_history`` entry and reach the
        callbacks' ``on_log`` and ``on_evaluate``; during ``train()`` the run folder keeps them under grpokit's
        names (``eval/reward`` ...; ``eval/<name>/reward`` for a dict's).

        ``eval_dataset``: evaluate this one instead of the trainer's (a dataset, a dict of them, a path, or the name
        of one of the trainer's dict); ``ignore_keys`` is TRL's and has nothing to ignore here;
        ``metric_key_prefix`` replaces ``eval`` in the returned names."""
        out: dict[str, float] = {}
        for name, (metrics, speed) in self._evaluations(eval_dataset).items():
            if self._writing:  # during train(): the run folder keeps grpokit's names (not the timings: a resume
                # reproduces every number it holds)
                self.run_log.evaluation(self.step, stored_eval_names(metrics, name), "eval" if name is None else name)
            prefix = metric_key_prefix if name is None else f"{metric_key_prefix}_{name}"
            logged = trl_eval_names(metrics | speed, prefix)
            self.callbacks.log(logged)
            self.callbacks.event("on_evaluate", metrics=logged)
            out |= logged
        return out | {"epoch": self.state.epoch}

    def evaluation_metrics(self, eval_dataset: Any = None) -> dict[str, float]:
        """:meth:`evaluate`'s metrics under grpokit's names, as metrics.jsonl keeps them (``eval/reward``,
        ``eval/pass@1`` ...; ``eval/<name>/reward`` for one of a dict of datasets), without a log entry."""
        out: dict[str, float] = {}
        for name, (metrics, _) in self._evaluations(eval_dataset).items():
            out |= stored_eval_names(metrics, name)
        return out

    def _evaluations(self, eval_dataset: Any = None) -> dict:
        """{eval set name (None: the one eval_dataset): (its metrics under grpokit's names (``eval/...``), the
        evaluation's timings: transformers' runtime, samples_per_second, steps_per_second)}."""
        sets = self._eval_sets_of(eval_dataset)
        state = self._reward_state(self.step + 1)
        results = {}
        for name, (source, rows) in sets.items():
            found = self.evaluator(source, rows, trainer_state=state)
            sampled = sample_metrics(found.rewards, found.num_samples, found.lengths, found.truncated)
            seconds = found.seconds
            metrics = {
                **{EVAL + k: v for k, v in sampled.items()},
                **{EVAL + k: v for k, v in self._evaluation_loss(found).items()},
                **found.metrics,
            }
            speed = {
                EVAL + "runtime": round(seconds, 4),
                EVAL + "samples_per_second": round(found.lengths.numel() / seconds, 3) if seconds else 0.0,
                EVAL + "steps_per_second": round(found.batches / seconds, 3) if seconds else 0.0,
            }
            results[name] = (metrics, speed)
        return results

    def _evaluation_loss(self, found) -> dict[str, float]:
        """TRL's evaluation loss of an evaluation's samples (``found``, an ``Evaluation``): each batch's advantages
        from its rewards (groups of num_generations_eval), then ``Learner.evaluation_loss``; the metrics (``loss``,
        ``entropy``, ``kl``, clip ratios) averaged over the batches, as TRL averages its eval batches. Not for an
        algorithm with a critic, nor across processes (the forward runs on rank 0 alone): {} then."""
        if self.algorithm.uses_critic or self.procs.enabled or not found.samples:
            return {}
        per_batch = []
        for rollouts, rewards in found.samples:
            loss_mask = update_inputs(self.update_inputs_spec, rollouts, self.device).loss_mask
            n = rollouts.completion_ids.size(0)
            advantages = self.algorithm.advantages(
                AdvantageInputs(rewards, rollouts.num_generations, slice(0, n), loss_mask), self.spec.algo
            )
            batch = build_batch(self.model, rollouts, self.tokenizer.pad_token_id, self.device)
            per_batch.append(self.learner.evaluation_loss(batch, advantages.advantages, loss_mask))
        return {key: sum(m[key] for m in per_batch) / len(per_batch) for key in per_batch[0]}

    def _eval_sets_of(self, eval_dataset: Any) -> dict:
        """{name: (PromptSource, rows)} to evaluate: the trainer's eval sets, one of them (``eval_dataset`` names a
        set of a dict, as TRL's ``evaluate("name")``), or ``eval_dataset`` given now, checked as at construction."""
        if eval_dataset is None:
            if not self.eval_sets:
                raise ValueError(
                    "evaluate() needs an eval_dataset: GRPOTrainer(eval_dataset=...), data.eval_dataset in the "
                    "config, or evaluate(eval_dataset=...)."
                )
            return self.eval_sets
        if isinstance(eval_dataset, str) and eval_dataset in self.eval_sets:
            return {eval_dataset: self.eval_sets[eval_dataset]}
        rows = setup.eval_sets(eval_dataset, self.spec.prompt_column, specs.prompt_builder(self.args))
        setup.check_data(self.args, self.train_rows, rows, self.rewards, self.procs.world_size)
        return setup.prompt_sources(self.args, self.tokenizer, self.train_rows, rows)[1]

    def _evaluate_and_log(self, step: int) -> None:
        """Rank 0 evaluates (:meth:`evaluate`: the run folder and the log); under FSDP every rank joins to gather
        the weights for it."""
        with self.procs.unsharded(self.model):
            if self.procs.is_main:
                self.evaluate()

    # ---- TRL's Trainer surface -------------------------------------------------------------
    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        """TRL's ``trainer.save_model()``: the model and its tokenizer in ``output_dir`` (default ``args.output_dir``),
        loadable with ``from_pretrained`` (with LoRA: the adapter, loadable with peft; a custom module:
        model.safetensors). Under FSDP every rank calls it (the weights are gathered to rank 0, which writes)."""
        folder = Path(output_dir if output_dir is not None else self.run_dir_spec.output_dir)
        save_model_files(folder, self.model, self.tokenizer, self.procs.is_main)

    def push_to_hub(self, commit_message: str = "End of training", blocking: bool = True, token=None, **kwargs):
        """TRL's ``trainer.push_to_hub()``: :meth:`save_model` to output_dir, then upload the model's files (not the
        run's store, checkpoints and reports) to the Hub repo ``hub_model_id`` (default: output_dir's name), created
        if needed. Without the Hub (offline, no network, no token) it raises one line saying where the model is."""
        from grpokit.hub import push_folder

        self.save_model()
        if not self.procs.is_main:
            return None
        hub, folder = self.spec.hub, Path(self.run_dir_spec.output_dir)
        return push_folder(
            folder,
            hub.model_id or folder.resolve().name,
            token=token or hub.token,
            private=hub.private,
            commit_message=commit_message,
            revision=kwargs.get("revision") or hub.revision,
        )

    def _save_checkpoint(self) -> None:
        """Rank 0 writes (after flushing the store and metrics.jsonl to disk, which the checkpoint records); under FSDP
        every rank joins to gather the weights and optimizer state."""
        record = self.run_log.seal() if self.procs.is_main else None
        if self.run_state.save(self.run_dir, self.step, record):
            if self.procs.is_main:
                self.run_folder.durable()  # the first checkpoint: an overwritten run can go now
            self.callbacks.event("on_save")

    def resume(self, path: str | Path) -> None:
        """Restore weights, optimizer, scheduler, RNG streams and data position from a checkpoint folder (checked
        against its manifest first)."""
        self.step = self.run_state.load(path)
        self.callbacks.set_step(self.step)

    def _reward_state(self, step: int) -> RewardState:
        """``trainer_state`` for the reward functions while step ``step`` is scored (TRL passes its state
        before the step's update: ``global_step`` counts the updates done)."""
        source = self.train_source
        epoch = source.epoch + source.position / len(source.usable)
        return RewardState(global_step=step - 1, max_steps=self.spec.max_steps, epoch=epoch)
