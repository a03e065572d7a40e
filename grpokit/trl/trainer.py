"""``GRPOTrainer``: TRL's surface over a built :class:`~grpokit.compose.Run`. It builds one and delegates: training and
evaluation to the loop (:mod:`grpokit.train.loop`), the parts (model, learner ...) to the Run."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from grpokit.compose import build_run
from grpokit.compose.patched_generate import sample_with_patched_generate
from grpokit.config import GRPOConfig
from grpokit.data.prompts import is_streaming
from grpokit.rewards.judge import ClassifierReward
from grpokit.train.learning.accelerator import ProcessAccelerator
from grpokit.train.loop import Loop
from grpokit.train.metrics import stored_eval_names
from grpokit.train.rundir.checkpoint import save_model_files
from grpokit.trl.completion_logs import CompletionLogs
from grpokit.trl.masks import TokenMasks
from grpokit.trl.run_attributes import RunAttributes


class GRPOTrainer(TokenMasks, RunAttributes, CompletionLogs):
    """Train a causal LM with GRPO-family RL.

    ``model``: a path, a hub id, a loaded HF model or a module with ``forward(input_ids) -> logits``. ``reward_funcs``:
    a callable, a built-in name / ``module:function`` / ``file.py:function`` spec, or a list of them (default
    ``args.rewards``). Datasets: a ``datasets.Dataset``, a list of dicts, or a JSONL / Parquet / CSV path.

    TRL's arguments work as in TRL: ``processing_class`` (``tokenizer`` is the same), ``peft_config`` (a peft
    ``LoraConfig``), ``reward_processing_classes``, ``callbacks`` (transformers ``TrainerCallback``s),
    ``optimizers=(optimizer, lr_scheduler)`` (either may be None: grpokit's AdamW / schedule), ``tools`` and
    ``environment_factory`` (multi-turn tool rollouts, docs/tools.md), ``eval_dataset`` (a dict of datasets is evaluated
    set by set), ``rollout_func`` (``fn(prompts, trainer) -> dict``: generates the completions; it receives each prompt
    ``num_generations`` times, adjacent) and ``teacher_model`` (GKD's: a distillation teacher). ``trainer.state`` is a
    transformers ``TrainerState``. What ``log_history``, the callbacks and ``evaluate()`` see is named as in TRL
    (``train/metrics.py``'s ``TRL_NAMES``); metrics.jsonl, the store and the console keep grpokit's names.
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
        teacher_model: Any = None,
    ):
        self.rollout_func = rollout_func  # TRL's: called by _generate, which the rollout_func engine calls
        self.run = build_run(
            args,
            model=model,
            reward_funcs=reward_funcs,
            train_dataset=train_dataset,
            eval_dataset=eval_dataset,
            processing_class=processing_class,
            tokenizer=tokenizer,
            reward_processing_classes=reward_processing_classes,
            callbacks=callbacks,
            optimizers=optimizers,
            peft_config=peft_config,
            tools=tools,
            environment_factory=environment_factory,
            rollout_func=rollout_func,
            generate=self._generate,  # the closure TRL's rollout_func(prompts, trainer) runs through
            teacher_model=teacher_model,
        )
        self.args = self.run.config  # the user's GRPOConfig (max_steps resolved), as TRL's trainer.args
        self.eval_dataset = eval_dataset if eval_dataset is not None else self.run.spec.eval_dataset
        # evaluate: in training too (an override of it runs); on_records fills TRL's _logs with log_completions
        self.loop = Loop(self.run, evaluate=lambda: self.evaluate(), on_records=self._start_completion_logs())
        self.run.callbacks.event("on_init_end")

    def _unbuilt(self, name: str) -> Any:
        """An attribute of a trainer not built by ``__init__`` (TRL's tests make one with ``object.__new__`` and set
        what they need), or the AttributeError Python would raise."""
        try:
            return self.__dict__[f"_{name}"]
        except KeyError:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}") from None

    def _set_unbuilt(self, name: str, value: Any) -> None:
        """Set what :meth:`_unbuilt` reads; a built trainer's parts are fixed (the loop holds them), so refused."""
        if "run" in self.__dict__:
            raise AttributeError(
                f"trainer.{name} is fixed when the trainer is built (the loop holds it); pass it to GRPOTrainer(...)."
            )
        self.__dict__[f"_{name}"] = value

    @property
    def state(self):
        """The run's transformers ``TrainerState`` (TRL's ``trainer.state``): global_step, max_steps, epoch,
        num_input_tokens_seen, log_history. Settable, as in TRL (the callbacks then see the new one)."""
        run = self.__dict__.get("run")
        return run.callbacks.state if run is not None else self._unbuilt("state")

    @state.setter
    def state(self, value) -> None:
        run = self.__dict__.get("run")
        if run is not None:
            run.callbacks.state = value
        else:
            self._set_unbuilt("state", value)

    @property
    def model(self) -> torch.nn.Module:
        """The policy (TRL's ``trainer.model``)."""
        run = self.__dict__.get("run")
        return run.model if run is not None else self._unbuilt("model")

    @model.setter
    def model(self, value) -> None:
        self._set_unbuilt("model", value)

    @property
    def tokenizer(self) -> Any:
        """The tokenizer (TRL's ``processing_class``)."""
        run = self.__dict__.get("run")
        return run.tokenizer if run is not None else self._unbuilt("processing_class")

    @property
    def processing_class(self) -> Any:
        """The tokenizer (TRL's name for it)."""
        return self.tokenizer

    @processing_class.setter
    def processing_class(self, value) -> None:
        self._set_unbuilt("processing_class", value)

    @property
    def ref_model(self):
        """TRL's ``trainer.ref_model``: the frozen reference copy, or None (beta = 0; LoRA: the adapters-off policy)."""
        return None if self.reference is None else self.reference.model

    @property
    def eval_rows(self) -> list[dict] | None:
        """The rows of the one eval dataset (None without one, or with a dict of them)."""
        found = self.eval_sets.get(None)
        return None if found is None else found[1]

    @property
    def sampling(self):
        return self.rollout_scheduler.sampling

    @property
    def reward_funcs(self) -> list:
        """The reward functions in scoring order (a reward model as its ``nn.Module``; environments' ``get_reward``
        last), as TRL's ``trainer.reward_funcs``."""
        return [fn.model if isinstance(fn, ClassifierReward) else fn for fn in self.rewards.functions]

    @property
    def reward_func_names(self) -> list[str]:
        return list(self.rewards.names)  # as in the rewards/<name>/mean metrics

    @property
    def reward_weights(self) -> torch.Tensor:
        """The weights of the reward functions [F], float32 as in TRL."""
        return self.rewards.weights.to(torch.float32)

    @property
    def reward_processing_classes(self) -> list:
        return [getattr(fn, "processing_class", None) for fn in self.rewards.functions]

    @property
    def tools(self) -> list:
        """The run's tools: the plain ones, then each environment's methods (of its first instance), as TRL's.
        Settable only on a trainer not built by ``__init__`` (TRL's tests make one with ``object.__new__``)."""
        if "run" not in self.__dict__:
            return self._unbuilt("tools")
        tool_rollouts = self.rollout_scheduler.tool_rollouts
        return [] if tool_rollouts is None else tool_rollouts.spec.all_tools()

    @tools.setter
    def tools(self, value) -> None:
        self._set_unbuilt("tools", value)

    @property
    def environments(self) -> list | None:
        """The environment instances of the last sampled rollouts, in order (None without environments)."""
        tool_rollouts = self.rollout_scheduler.tool_rollouts
        return None if tool_rollouts is None else tool_rollouts.environments

    @property
    def accelerator(self) -> ProcessAccelerator:
        """TRL's ``trainer.accelerator``: this run's processes, as accelerate answers. Settable (a test's stand-in)."""
        given = self.__dict__.get("_accelerator")
        return given if given is not None else ProcessAccelerator(self.procs, self.device)

    @accelerator.setter
    def accelerator(self, value) -> None:
        self.__dict__["_accelerator"] = value

    def _generate(self, prompts: list):
        """TRL's ``_generate`` on its rollout_func path: ``self.rollout_func(prompts, self)`` on a copy of ``prompts``,
        its dict checked (:func:`grpokit.rollout.rollout_func.check_output`) and returned as a ``RolloutFuncOutput``."""
        from grpokit.rollout.rollout_func import check_output

        if self.rollout_func is None:
            raise RuntimeError("_generate calls rollout_func, and this trainer has none; GRPOTrainer(rollout_func=fn).")
        prompts = copy.deepcopy(prompts)
        return check_output(self.rollout_func(prompts, self), len(prompts))

    def add_callback(self, callback: Any) -> None:  # a TrainerCallback (instance or class), as in transformers
        self.callbacks.add(callback)

    def get_train_dataloader(self) -> torch.utils.data.DataLoader:
        """A DataLoader over the training rows as Trainer gives it (training itself samples its prompts from the
        seeded, resumable prompt source)."""
        streaming = is_streaming(self.train_dataset)
        return self.run.data_reader.loader(self.train_rows, train=True, streaming=streaming)

    def get_eval_dataloader(self, eval_dataset: Any = None) -> torch.utils.data.DataLoader:
        """A DataLoader over an eval set's rows: ``eval_dataset`` None (the one eval dataset), a name of a dict of
        them, or a dataset."""
        if eval_dataset is None or isinstance(eval_dataset, str):
            name, given = eval_dataset, self.eval_dataset
            given = given[name] if name is not None and isinstance(given, Mapping) else given
            rows = self.eval_sets[name][1]
        else:
            given, rows = eval_dataset, self.run.data_reader.rows(eval_dataset)
        return self.run.data_reader.loader(rows, train=False, streaming=is_streaming(given))

    def train(self, resume_from_checkpoint: str | bool | None = None):
        """Train to max_steps (or until stopped); returns transformers' ``TrainOutput(global_step, training_loss,
        metrics)`` as TRL does. ``resume_from_checkpoint``: True = the latest checkpoint of output_dir, or a
        checkpoint folder. An output_dir that holds a run is refused unless told to resume it (or ``overwrite``)."""
        from transformers.trainer_utils import TrainOutput

        resume = {False: None, True: "latest"}.get(resume_from_checkpoint or False, str(resume_from_checkpoint))
        sample_with_patched_generate(self.run)  # model.generate replaced on the instance: sample through it, as TRL
        summary = self.loop.train(resume)
        return TrainOutput(self.loop.step, summary["train_loss"], summary)

    def resume(self, path: str | Path) -> None:  # weights, optimizer, RNG and data position from a checkpoint
        self.loop.resume(path)

    def evaluate(self, eval_dataset: Any = None, ignore_keys: list | None = None, metric_key_prefix: str = "eval"):
        """TRL's ``trainer.evaluate()``: sample ``num_generations_eval`` completions of each eval prompt (and one
        greedily), score them, and return TRL's names (``eval_reward``, ``eval_rewards/<fn>/mean`` ...,
        ``eval_runtime`` ..., grpokit's ``eval_pass@k``), with ``epoch``. ``eval_dataset``: a dataset, a dict of
        them, a path, or the name of one of the trainer's dict; ``ignore_keys`` has nothing to ignore here."""
        return self.loop.evaluate(self._eval_sets_of(eval_dataset), metric_key_prefix) | {"epoch": self.state.epoch}

    def evaluation_metrics(self, eval_dataset: Any = None) -> dict[str, float]:
        """:meth:`evaluate`'s metrics under grpokit's names, as metrics.jsonl keeps them, without a log entry."""
        from grpokit.train.evaluation import evaluations

        found = evaluations(self.run, self._eval_sets_of(eval_dataset), self.loop.step)
        return {k: v for name, (metrics, _, _) in found.items() for k, v in stored_eval_names(metrics, name).items()}

    def _eval_sets_of(self, eval_dataset: Any) -> dict:
        """{name: (PromptSource, rows)} to evaluate: the run's eval sets, one of them, or ``eval_dataset`` given now,
        checked as at construction."""
        if eval_dataset is None:
            if not self.eval_sets:
                raise ValueError(
                    "evaluate() needs an eval_dataset: GRPOTrainer(eval_dataset=...), data.eval_dataset in the "
                    "config, or evaluate(eval_dataset=...)."
                )
            return self.eval_sets
        if isinstance(eval_dataset, str) and eval_dataset in self.eval_sets:
            return {eval_dataset: self.eval_sets[eval_dataset]}
        return self.run.data_reader.eval_sets(eval_dataset)

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        """TRL's ``trainer.save_model()``: the model and its tokenizer in ``output_dir`` (default ``args.output_dir``),
        loadable with ``from_pretrained``. Under FSDP every rank calls it (rank 0 writes)."""
        folder = Path(output_dir if output_dir is not None else self.run.run_dir_spec.output_dir)
        save_model_files(folder, self.model, self.tokenizer, self.procs.is_main)

    def push_to_hub(self, commit_message: str = "End of training", blocking: bool = True, token=None, **kwargs):
        """TRL's ``trainer.push_to_hub()``: :meth:`save_model`, then upload the model's files to ``hub_model_id``
        (default: output_dir's name). Without the Hub it raises one line saying where the model is."""
        from grpokit.models.hub import push_folder

        self.save_model()
        if not self.procs.is_main:
            return None
        hub, folder = self.spec.hub, Path(self.run.run_dir_spec.output_dir)
        return push_folder(
            folder,
            hub.model_id or folder.resolve().name,
            token=token or hub.token,
            private=hub.private,
            commit_message=commit_message,
            revision=kwargs.get("revision") or hub.revision,
        )
