"""The prompt source's settings (:mod:`grpokit.data.prompts`, :mod:`grpokit.data.prompt_builder`): keys of the ``data``
section, which is assembled from this class; torch-free."""

from __future__ import annotations

import difflib
import string
from dataclasses import dataclass

from grpokit.data.sources import DATASET_KEYS
from grpokit.errors import ConfigError, require


@dataclass
class PromptSettings:
    """The datasets and how each row becomes a prompt."""

    train_dataset: str | dict | None = None
    """A JSONL / JSON / Parquet / CSV file, a datasets folder (save_to_disk), `builtin:arithmetic`, or what
    datasets.load_dataset loads: a mapping {path, name, split, data_files, data_dir, revision} (path: a hub id such as
    openai/gsm8k, a folder of data files, or json / csv / parquet with data_files), in short hf:PATH[:NAME[:SPLIT]]."""
    eval_dataset: str | dict | None = None
    """Same forms as train_dataset; evaluation is skipped when empty."""
    prompt_column: str = "prompt"
    """Column holding the prompt: a string, or chat messages [{role, content}, ...]; with prompt_template, the column
    the built prompt is written to."""
    prompt_template: str | None = None
    """Build each prompt from its row: a format string naming columns in braces, e.g. "{question}\nAnswer after ####."
    (literal braces doubled: {{ }}); null = the prompt_column as it is. The reward functions still get every column."""
    system_prompt: str | None = None
    """A system message put before each prompt."""
    use_chat_template: bool | None = None
    """true: each prompt is chat messages ([system,] user), rendered by the tokenizer's chat template | false: plain
    text (the system prompt, a blank line, the prompt) | null: true when prompt_template or system_prompt is set.
    Prompts that are chat messages in the data always get the chat template."""
    max_prompt_length: int | None = 512
    """Prompts longer than this many tokens are handled per `prompt_overflow`; null = no limit."""
    prompt_overflow: str = "truncate"
    """truncate (keep the last max_prompt_length tokens) | drop (skip the prompt) | error."""
    shuffle: bool = True
    """Shuffle the prompts each epoch (seeded)."""

    def check(self) -> None:
        require(
            self.max_prompt_length is None or self.max_prompt_length >= 1,
            f"max_prompt_length={self.max_prompt_length} must be >= 1 or null.",
        )
        for name in ("train_dataset", "eval_dataset"):
            dataset(name, getattr(self, name))
        if self.prompt_template is not None:
            prompt_template(self.prompt_template)


def dataset(name: str, value: object) -> None:
    """A dataset mapping has datasets.load_dataset's keys and a path; hf:PATH[:NAME[:SPLIT]] has a path."""
    example = "e.g. {path: openai/gsm8k, name: main, split: train}"
    if isinstance(value, str) and value.startswith("hf:"):
        require(
            bool(value[3:].split(":", 1)[0]),
            f"{name}={value!r} names no dataset; write hf:PATH[:NAME[:SPLIT]], e.g. hf:openai/gsm8k:main:train.",
        )
        return
    if not isinstance(value, dict):
        return
    for key in value:
        if key not in DATASET_KEYS:
            close = difflib.get_close_matches(str(key), DATASET_KEYS, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ConfigError(
                f"{name} has an unknown key {key!r}; a dataset mapping takes {', '.join(DATASET_KEYS)} (the "
                f"arguments of datasets.load_dataset), {example}.{hint}"
            )
    require(
        isinstance(value.get("path"), str) and bool(value["path"]),
        f"{name} needs a path: a hub id, a local folder, or json / csv / parquet with data_files; {example}.",
    )
    for key in ("name", "split", "data_dir", "revision"):
        require(
            value.get(key) is None or isinstance(value[key], str),
            f"{name}.{key}={value.get(key)!r} must be a string, {example}.",
        )
    files = value.get("data_files")
    require(
        files is None or isinstance(files, (str, list, dict)),
        f"{name}.data_files={files!r} must be a path, a list of paths or a mapping of split -> paths.",
    )


def prompt_template(template: str) -> None:
    try:
        fields = [field for _, field, _, _ in string.Formatter().parse(template) if field is not None]
    except ValueError as exc:
        raise ConfigError(
            f"prompt_template={template!r} is not a valid format string ({exc}); name columns in braces, e.g. "
            "{question}, and write literal braces as {{ and }}."
        ) from None
    require(
        bool(fields) and all(field and not field[0].isdigit() for field in fields),
        f"prompt_template={template!r} names no column; put the column in braces, e.g. "
        '"{question}\\nAnswer after ####." (literal braces are written {{ and }}).',
    )
