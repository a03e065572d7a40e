"""TRL's ``trainer._logs``: the latest generation batch's prompts, completions, rewards, advantages, ``log_extra``
columns and images, in TRL's layout, for a callback or subclass that reads it.

``{"images": deque, "prompt": deque, "completion": deque, "rewards": defaultdict(name -> deque), "advantages":
deque, "extra": defaultdict(column -> deque)}``, every deque of ``maxlen`` = the completions of one step over all
processes (TRL's ``generation_batch_size``: one grpokit step is one generation batch), so it holds the latest
batch. Filled on the main process from the step's rollout records, only with ``log_completions`` (the records are
on the host already; without it nothing is done). Values as TRL's: a prompt as the dataset gave it (a string or a
list of messages), a completion as the reward functions got it (the text, or ``[{"role": "assistant", "content":
text}]`` for a conversational prompt), rewards and advantages as floats (NaN where a reward function did not
apply), each ``log_extra`` column of the step (None on the rows that did not log it), and with ``log_multimodal``
each completion's prompt images (a list of PIL images) when the step has any.
"""

from __future__ import annotations

import math
from collections import defaultdict, deque
from collections.abc import Sequence
from typing import Any


def completion_logs(maxlen: int) -> dict[str, Any]:
    """An empty ``_logs`` whose deques keep the last ``maxlen`` values."""
    return {
        "images": deque(maxlen=maxlen),
        "prompt": deque(maxlen=maxlen),
        "completion": deque(maxlen=maxlen),
        "rewards": defaultdict(lambda: deque(maxlen=maxlen)),
        "advantages": deque(maxlen=maxlen),
        "extra": defaultdict(lambda: deque(maxlen=maxlen)),
    }


def _float(value: float | None) -> float:
    return math.nan if value is None else float(value)


def add_records(
    logs: dict[str, Any],
    records: Sequence[Any],
    prompts: Sequence[Any],
    reward_names: Sequence[str],
    log_multimodal: bool,
) -> None:
    """Append one step's ``records`` (``store.record.RolloutRecord``, in rollout order) to ``logs``; ``prompts``:
    each record's prompt as the dataset gave it; ``reward_names``: every reward function, in order."""
    logs["prompt"].extend(prompts)
    logs["completion"].extend(
        [{"role": "assistant", "content": r.completion}] if isinstance(p, list) else r.completion
        for r, p in zip(records, prompts, strict=True)
    )
    for name in reward_names:
        logs["rewards"][name].extend(_float(r.rewards.get(name)) for r in records)
    logs["advantages"].extend(_float(r.advantage) for r in records)
    columns = sorted({column for r in records for column in r.extra or {}})
    for column in columns:
        logs["extra"][column].extend((r.extra or {}).get(column) for r in records)
    if log_multimodal and any(r.image_sources for r in records):
        logs["images"].extend(list(r.image_sources or []) for r in records)


class CompletionLogs:
    """GRPOTrainer's ``_logs`` (TRL's): made empty at construction, filled from each step's records with
    ``log_completions`` only (no cost without it)."""

    def _start_completion_logs(self):
        """Make ``self._logs``; the loop's ``on_records`` hook that fills it (None without ``log_completions``)."""
        spec = self.run.spec
        self._logs = completion_logs(spec.completions_per_step)
        return self._log_records if spec.log_completions else None

    def _log_records(self, records: list) -> None:
        """A step's rollout records into ``_logs`` (rank 0), each prompt as the dataset gave it (its text where
        the row has none: an environment's prompts)."""
        spec = self.run.spec
        rows, column = self.run.train_source.rows, spec.prompt_column or "prompt"
        prompts = [rows[r.prompt_index].get(column, r.prompt) for r in records]
        add_records(self._logs, records, prompts, self.reward_func_names, spec.log_multimodal)
