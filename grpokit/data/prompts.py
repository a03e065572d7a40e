"""Prompt datasets: loading (datasets.Dataset, list of dicts, or a source: grpokit.data.sources), prompts built from
columns (grpokit.data.prompt_builder), validation, chat templates, prompt length limits, and a seeded, resumable
batch order."""

from __future__ import annotations

import difflib
import inspect
from pathlib import Path
from typing import Any

import numpy as np

from grpokit.data.images import ImagePrompts
from grpokit.data.prompt_builder import PromptBuilder
from grpokit.data.sources import DataError, read_source
from grpokit.models.loading import decode, encode_prompt

__all__ = ["DataError", "PromptBuilder", "PromptSource", "load_rows", "render_prompt", "reward_arguments"]


def is_streaming(dataset: Any) -> bool:
    """Whether ``dataset`` is a datasets ``IterableDataset`` (the streaming form, with no length)."""
    return type(dataset).__name__ == "IterableDataset"


def load_rows(
    source: Any,
    prompt_column: str = "prompt",
    name: str = "train_dataset",
    prompts: PromptBuilder | None = None,
    default_prompt: list | None = None,
) -> list[dict]:
    """Rows of a dataset given as a datasets.Dataset or IterableDataset, a list of dicts, a file or folder path,
    ``builtin:<task>``, or
    what datasets.load_dataset loads (``hf:...`` or a mapping: :mod:`grpokit.data.sources`), with each prompt built
    by ``prompts`` (the config's prompt_template / system_prompt / use_chat_template) when given, then checked.
    ``default_prompt``: the prompt of a row that still has none (a copy of the row gets a copy of it), for
    environments whose ``reset()`` supplies the prompt (TRL: such a dataset may only route rows to environments)."""
    if source is None:
        raise DataError(
            f"{name} is not set; give a JSONL / Parquet / CSV path, a datasets folder, a hub dataset "
            "(hf:openai/gsm8k:main:train), a list of dicts or a datasets.Dataset."
        )
    if isinstance(source, (str, Path, dict)):
        rows = read_source(source, name)
    elif isinstance(source, list):
        rows = source
    elif hasattr(source, "to_list"):
        rows = source.to_list()
    elif is_streaming(source):  # finite: it is read whole
        rows = [dict(row) for row in source]
    else:
        raise DataError(f"{name} has type {type(source).__name__}; give a path, a list of dicts or a datasets.Dataset.")
    if rows and prompts is not None:
        rows = prompts.apply(rows, name)
    if default_prompt is not None:
        rows = [
            {**row, prompt_column: [dict(m) for m in default_prompt]}
            if isinstance(row, dict) and prompt_column not in row
            else row
            for row in rows
        ]
    if not rows:
        raise DataError(f"{name} is empty; it needs at least one row with a {prompt_column!r} column.")
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise DataError(
                f"{name} row {i} is a {type(row).__name__}, not a mapping; each row must be a dict with a "
                f"{prompt_column!r} key."
            )
        if prompt_column not in row:
            keys = ", ".join(map(repr, row)) or "none"
            close = difflib.get_close_matches(prompt_column, [str(k) for k in row], n=1)
            hint = f" Did you mean prompt_column: {close[0]}?" if close else ""
            raise DataError(
                f"{name} row {i} has no {prompt_column!r} column (columns: {keys}); set data.prompt_column to the "
                f"column that holds the prompt.{hint}"
            )
        prompt = row[prompt_column]
        if prompt is None or (isinstance(prompt, (str, list)) and len(prompt) == 0):
            raise DataError(f"{name} row {i} has an empty {prompt_column!r}; remove the row or fill in its prompt.")
        if not isinstance(prompt, (str, list)):
            raise DataError(
                f"{name} row {i}: {prompt_column!r} must be a string or a list of chat messages, got "
                f"{type(prompt).__name__}."
            )
    return rows


# What the trainer passes to every reward function besides the dataset's columns (TRL's keywords).
REWARD_KEYWORDS = (
    "prompts",
    "completions",
    "completion_ids",
    "trainer_state",
    "log_metric",
    "log_extra",
    "completion_lengths",
    "environments",
)


def reward_columns(fn: Any) -> list[str]:
    """Dataset columns a reward function needs: its ``required_columns`` attribute when it has one,
    else its named parameters without a default that are not the trainer's own keywords, as
    ``answer`` in ``def exact(prompts, completions, answer, **columns)``."""
    declared = getattr(fn, "required_columns", None)
    if declared is not None:
        return list(declared)
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):  # builtins and some C callables have no signature
        return []
    named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return [
        p.name
        for p in params
        if p.kind in named and p.default is inspect.Parameter.empty and p.name not in REWARD_KEYWORDS
    ]


def check_reward_columns(
    rows: list[dict], rewards: dict[str, Any], prompt_column: str = "prompt", name: str = "train_dataset"
) -> None:
    """Fail before training when a reward needs a column that a row lacks. ``rewards``: {name: function}."""
    for reward, fn in rewards.items():
        for column in reward_columns(fn):
            if column == prompt_column:  # never passed as a column: the prompts are a keyword of their own
                raise DataError(
                    f"reward {reward!r} asks for {column!r}, the prompt column, which the trainer passes as the "
                    "keyword 'prompts' (one per completion); rename the parameter to prompts."
                )
            missing = next((i for i, row in enumerate(rows) if column not in row), None)
            if missing is not None:
                columns = ", ".join(repr(k) for k in rows[missing] if k != prompt_column) or "none"
                keyword = difflib.get_close_matches(column, REWARD_KEYWORDS, n=1, cutoff=0.8)
                fix = (
                    f"did you mean the keyword {keyword[0]!r}, which the trainer passes? Rename the parameter to "
                    f"{keyword[0]}, or add a column {column!r} to the data."
                    if keyword
                    else f"add the column {column!r} to the data, or configure the reward to read another column."
                )
                raise DataError(
                    f"reward {reward!r} needs the column {column!r}, but {name} row {missing} has none (its other "
                    f"columns: {columns}); {fix}"
                )


def render_prompt(tokenizer, prompt: str | list, **template_kwargs) -> tuple[str, bool]:
    """Prompt text and whether a chat template produced it (chat messages get the template, with
    ``template_kwargs``: TRL's chat_template_kwargs, e.g. ``enable_thinking=False``)."""
    if isinstance(prompt, str):
        return prompt, False
    if not getattr(tokenizer, "chat_template", None):
        raise DataError(
            "a prompt is a list of chat messages but the tokenizer has no chat_template; give plain string prompts "
            "(data.use_chat_template: false) or a tokenizer with a chat template."
        )
    return tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True, **template_kwargs), True


class PromptSource:
    """Tokenised prompts in a seeded order; ``state_dict`` holds the position so a resumed run
    draws the same next batch.

    Prompts longer than ``max_prompt_length`` tokens are truncated from the left (keeping the end,
    which holds the question) or dropped, per ``overflow``; both are counted. A prompt with images
    (:class:`grpokit.data.images.ImagePrompts`) is dropped, never cut through its image tokens.
    """

    def __init__(
        self,
        rows: list[dict],
        tokenizer,
        prompt_column: str = "prompt",
        max_prompt_length: int | None = None,
        overflow: str = "truncate",
        seed: int = 0,
        shuffle: bool = True,
        template_kwargs: dict | None = None,
        image_column: str | None = None,
    ):
        self.rows, self.seed, self.shuffle = rows, seed, shuffle
        self.texts: list[str] = []
        self.ids: list[list[int]] = []
        self.num_truncated = 0
        self.num_dropped = 0
        keep = []
        images = ImagePrompts.for_rows(rows, tokenizer, image_column, template_kwargs)  # None: no image anywhere
        for i, row in enumerate(rows):
            encoded = None if images is None else images.encode(row, row[prompt_column], f"prompt {i}")
            if encoded is not None:  # token ids with the image tokens, and the pixel inputs (a VisionPrompt)
                text, ids = encoded
            else:
                text, chat = render_prompt(tokenizer, row[prompt_column], **(template_kwargs or {}))
                ids = encode_prompt(tokenizer, text, chat)
            if max_prompt_length is not None and len(ids) > max_prompt_length:
                if overflow == "error":
                    raise DataError(
                        f"prompt {i} has {len(ids)} tokens, more than max_prompt_length={max_prompt_length}; raise "
                        "max_prompt_length or set prompt_overflow: truncate or drop."
                    )
                if overflow == "drop" or encoded is not None:  # a prompt is never cut through its images
                    self.num_dropped += 1
                    self.texts.append(text)
                    self.ids.append(ids)
                    continue
                ids = ids[-max_prompt_length:]
                self.num_truncated += 1
            self.texts.append(text)
            self.ids.append(ids)
            keep.append(i)
        if not keep:
            raise DataError(
                f"every prompt is longer than max_prompt_length={max_prompt_length} and was dropped; raise "
                "max_prompt_length."
            )
        self.usable = np.array(keep)
        self.epoch = 0
        self.position = 0
        self._order = self._make_order()
        self.curriculum = None  # a data.curriculum.Curriculum drawing by the prompts' history; None: this order

    @property
    def longest(self) -> int:
        """The longest usable prompt, in tokens (after truncation; dropped prompts left out)."""
        return max(len(self.ids[i]) for i in self.usable)

    def _make_order(self) -> np.ndarray:
        if not self.shuffle:
            return self.usable
        return np.random.default_rng([self.seed, self.epoch]).permutation(self.usable)

    def next_indices(self, batch_size: int) -> list[int]:
        """The next ``batch_size`` distinct row indices. A batch never spans two epochs (the last
        ``len % batch_size`` prompts of an epoch are skipped, a different few each shuffled epoch),
        so no prompt appears twice in one step."""
        if batch_size > len(self._order):
            raise DataError(
                f"a step needs {batch_size} distinct prompts but only {len(self._order)} are usable; "
                "add prompts or lower per_device_train_batch_size x gradient_accumulation_steps / num_generations."
            )
        chosen = None if self.curriculum is None else self.curriculum.choose(self, batch_size)
        if chosen is not None:
            return chosen
        if self.position + batch_size > len(self._order):
            self.epoch += 1
            self.position = 0
            self._order = self._make_order()
        out = [int(i) for i in self._order[self.position : self.position + batch_size]]
        self.position += batch_size
        return out

    def state_dict(self) -> dict:
        curriculum = {} if self.curriculum is None else self.curriculum.state_dict()
        return {"epoch": self.epoch, "position": self.position, **curriculum}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
        self._order = self._make_order()
        if self.curriculum is not None:
            self.curriculum.load_state_dict(state)

    @property
    def drawn_by_history(self) -> bool:
        """Whether a curriculum draws the batches by the prompts' history, which only rank 0 holds (the store): then
        under torchrun rank 0 draws each batch and sends it to the others (train/experience/rollout_scheduler.py)."""
        return self.curriculum is not None and not self.curriculum.ordered

    def read_history(self, history) -> None:
        """The curriculum (if any) reads the prompts' history with ``history()`` (the run's store's prompt_history)."""
        if self.curriculum is not None:
            self.curriculum.history = history

    def curriculum_metrics(self) -> dict[str, float]:
        """The curriculum's ``curriculum/*`` of the last batch drawn ({} without one, or uniform)."""
        return {} if self.curriculum is None else self.curriculum.metrics()


def reward_inputs(
    rows: list[dict], indices: list[int], num_generations: int, prompt_column: str, completion_lengths: list[int]
) -> dict[str, list]:
    """The columns passed to reward functions for G completions of each prompt in ``indices``:
    every dataset column but the prompt, repeated G times, plus ``completion_lengths`` (tokens)."""
    columns = {
        k: [rows[i].get(k) for i in indices for _ in range(num_generations)]
        for k in rows[indices[0]]
        if k != prompt_column
    }
    columns["completion_lengths"] = list(completion_lengths)
    return columns


def reward_arguments(rows: list[dict], indices: list[int], rollouts, tokenizer, prompt_column: str):
    """``(prompts, completions, columns, completion_ids)`` for the reward functions, of ``rollouts`` (G per prompt)
    of the prompts ``rows[i]`` for i in ``indices``: each prompt as the dataset holds it (chat messages stay
    messages, as TRL passes them), G times; the decoded completions; :func:`reward_inputs`' columns; each
    completion's token ids up to its length. Columns that came with the rollouts (``rollouts.columns``) are added,
    replacing a dataset column of the same name."""
    G, lengths = rollouts.num_generations, rollouts.completion_lengths
    completion_ids = [ids[: int(n)].tolist() for ids, n in zip(rollouts.completion_ids, lengths)]
    completions = [decode(tokenizer, ids) for ids in completion_ids]
    prompts = [rows[i][prompt_column] for i in indices for _ in range(G)]
    columns = reward_inputs(rows, indices, G, prompt_column, lengths.tolist())
    if rollouts.columns:  # the sampler's own (a rollout_func's other keys) win over the dataset's, as in TRL
        columns.update(rollouts.columns)
    return prompts, completions, columns, completion_ids
