"""The datasets of a run: checked against the reward functions and the step size, turned into prompt sources, and
the DataReader that reads a dataset given after the build."""

from __future__ import annotations

import warnings

from grpokit.compose import specs
from grpokit.config import ConfigError, GRPOConfig
from grpokit.config.trl_forms import accelerator_settings
from grpokit.data.readers import DataReader, eval_set_name


def streaming_train_args(args: GRPOConfig) -> GRPOConfig:
    """TRL's settings for a streaming (iterable) train dataset: each process reads the stream itself
    (``accelerator_config.dispatch_batches`` False; True is refused, as in TRL) and one worker reads it in order
    (``dataloader_num_workers`` 0), so no group of ``num_generations`` is split."""
    if args.accelerator_config.dispatch_batches:
        raise ConfigError(
            "Iterable datasets require `dispatch_batches=False`: each process reads the stream itself. Remove "
            "dispatch_batches from accelerator_config, or give a map-style datasets.Dataset."
        )
    accelerator = {**accelerator_settings(args.accelerator_config), "dispatch_batches": False}
    with warnings.catch_warnings():  # the user's own accelerator_config was named in the warning already
        warnings.simplefilter("ignore", UserWarning)
        return args.replace(dataloader_num_workers=0, accelerator_config=accelerator)


def check_data(args: GRPOConfig, train_rows: list, evals: dict, rewards, world_size: int, columns: bool = True) -> int:
    """Check the datasets (``evals``: :func:`eval_sets`) against the reward functions' columns (unless ``columns`` is
    False: a rollout_func may supply them) and the step size; returns the steps per epoch (prompts // prompts per
    step: TRL drops a last partial batch too)."""
    from grpokit.data.prompts import DataError, check_reward_columns

    reward_fns = dict(zip(rewards.names, rewards.functions)) if columns else {}
    check_reward_columns(train_rows, reward_fns, args.prompt_column)
    per_step = args.prompts_per_step(world_size)
    if len(train_rows) < per_step:
        raise DataError(
            f"train_dataset has {len(train_rows)} prompts but a step takes {per_step} distinct ones; add prompts or "
            "lower per_device_train_batch_size x gradient_accumulation_steps / num_generations."
        )
    for name, rows in evals.items():
        check_reward_columns(rows, reward_fns, args.prompt_column, eval_set_name(name))
    return len(train_rows) // per_step


def prompt_sources(args: GRPOConfig, tokenizer, train_rows: list, evals: dict):
    """(training PromptSource: seeded order, shuffled per ``shuffle``; {name: (eval PromptSource in dataset order,
    its rows)} of ``evals``, :func:`grpokit.data.readers.eval_sets`)."""
    from grpokit.data.prompts import PromptSource

    train = PromptSource(train_rows, tokenizer, seed=args.seed, shuffle=args.shuffle, **prompt_source_kwargs(args))
    if args.curriculum != "uniform":  # drawn by the prompts' history in the store (data/curriculum.py)
        from grpokit.data.curriculum import Curriculum

        train.curriculum = Curriculum(args.curriculum, args, args.seed)
    return train, data_reader(args, tokenizer, None).prompt_sources(evals)


def prompt_source_kwargs(args: GRPOConfig) -> dict:
    """How any PromptSource of the run reads its prompts."""
    return dict(
        prompt_column=args.prompt_column,
        max_prompt_length=args.max_prompt_length,
        overflow=args.prompt_overflow,
        template_kwargs=args.chat_template_kwargs,  # TRL's
        image_column=args.image_column,  # vision-language models (data/images.py)
    )


def data_reader(args: GRPOConfig, tokenizer, rewards) -> DataReader:
    """What reads a dataset given after the build (``trainer.evaluate(eval_dataset=...)``, the data loaders), with
    the run's settings: its own part of the Run, so the trainer never calls back into the builders."""
    return DataReader(
        prompt_column=args.prompt_column,
        prompts=specs.prompt_builder(args),
        source_kwargs=prompt_source_kwargs(args),
        tokenizer=tokenizer,
        reward_fns={} if rewards is None else dict(zip(rewards.names, rewards.functions)),
        train_batch_size=args.per_device_train_batch_size,
        eval_batch_size=args.per_device_eval_batch_size,
        workers=args.dataloader_num_workers,
    )
