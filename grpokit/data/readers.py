"""Reading datasets into a run's prompts: eval sets by name, and what reads a dataset given after the build
(:class:`DataReader`: ``trainer.evaluate(eval_dataset=...)`` and the data loaders), built once with the run's
settings."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


def eval_sets(eval_dataset: Any, prompt_column: str, prompts=None, default_prompt: list | None = None) -> dict:
    """The eval datasets' rows by name: ``{}`` without one; ``{None: rows}`` for one dataset (a ``datasets.Dataset``
    or ``IterableDataset``, a list of dicts, a path, a ``datasets.load_dataset`` mapping with a ``path``);
    ``{name: rows}`` for a dict of them (TRL's: a dict, ``DatasetDict`` or ``IterableDatasetDict``), each evaluated
    on its own, its metrics named ``eval_<name>_...``. ``prompts``, ``default_prompt``: as ``load_rows`` takes them."""
    from grpokit.data.prompts import DataError, load_rows
    from grpokit.data.sources import DATASET_KEYS

    if eval_dataset is None:
        return {}
    load_spec = type(eval_dataset) is dict and "path" in eval_dataset and set(eval_dataset) <= set(DATASET_KEYS)
    if isinstance(eval_dataset, Mapping) and not load_spec:
        if not eval_dataset:
            raise DataError("eval_dataset is an empty dict; give at least one {name: dataset}, or no eval_dataset.")
        return {
            str(name): load_rows(ds, prompt_column, eval_set_name(str(name)), prompts, default_prompt)
            for name, ds in eval_dataset.items()
        }
    return {None: load_rows(eval_dataset, prompt_column, "eval_dataset", prompts, default_prompt)}


def eval_set_name(name: str | None) -> str:
    """How messages name an eval set: ``eval_dataset``, or ``eval_dataset['name']`` for one of a dict."""
    return "eval_dataset" if name is None else f"eval_dataset[{name!r}]"


@dataclass(frozen=True)
class DataReader:
    """The run's way of reading a dataset given after the build: ``prompt_column``, the ``prompts`` builder
    (``data.prompt_builder.PromptBuilder``), ``source_kwargs`` (how a ``PromptSource`` reads them), the
    ``tokenizer``, the reward functions by name (``reward_fns``: the columns they need are checked), and the data
    loaders' batch sizes and ``workers``."""

    prompt_column: str
    prompts: Any
    source_kwargs: dict
    tokenizer: Any
    reward_fns: dict
    train_batch_size: int
    eval_batch_size: int
    workers: int

    def prompt_sources(self, evals: dict) -> dict:
        """{name: (PromptSource in dataset order, rows)} of ``evals`` ({name: rows})."""
        from grpokit.data.prompts import PromptSource

        kw = self.source_kwargs
        return {name: (PromptSource(rows, self.tokenizer, shuffle=False, **kw), rows) for name, rows in evals.items()}

    def eval_sets(self, eval_dataset: Any) -> dict:
        """{name: (PromptSource, rows)} of an eval dataset (or a dict of them), its columns checked against the
        reward functions as at construction."""
        from grpokit.data.prompts import check_reward_columns

        rows = eval_sets(eval_dataset, self.prompt_column, self.prompts)
        for name, found in rows.items():
            check_reward_columns(found, self.reward_fns, self.prompt_column, eval_set_name(name))
        return self.prompt_sources(rows)

    def loader(self, rows: list[dict], train: bool, streaming: bool):
        """transformers' Trainer data loader over ``rows``: the per-device train or eval batch size, as lists of row
        dicts, ``workers`` workers; one (0) for a streaming dataset, whose order the workers would interleave."""
        import torch

        batch_size = self.train_batch_size if train else self.eval_batch_size
        return torch.utils.data.DataLoader(
            rows, batch_size=batch_size, num_workers=0 if streaming else self.workers, collate_fn=list
        )

    def rows(self, eval_dataset: Any) -> list[dict]:
        """The rows of one eval dataset, as read for evaluation."""
        return eval_sets(eval_dataset, self.prompt_column)[None]
