"""Prompts built from a dataset's columns by the config: a template over the row (``prompt_template``), a system
message (``system_prompt``), and chat messages for the tokenizer's chat template or plain text
(``use_chat_template``), so that a dataset such as GSM8K (``question``, ``answer``) trains without a Python
``dataset.map``. The built prompt goes into ``prompt_column``; every other column stays, for the reward functions.
"""

from __future__ import annotations

import difflib
import string
from dataclasses import dataclass

from grpokit.data.sources import DataError


@dataclass(frozen=True)
class PromptBuilder:
    """How each row's prompt is built; :meth:`apply` leaves the rows as they are when nothing is set."""

    column: str
    template: str | None
    system_prompt: str | None
    chat: bool | None  # None: chat messages when template or system_prompt is set

    @property
    def active(self) -> bool:
        return self.template is not None or self.system_prompt is not None or self.chat is not None

    @property
    def as_chat(self) -> bool:
        return self.chat if self.chat is not None else (self.template is not None or self.system_prompt is not None)

    def columns(self) -> list[str]:
        """The columns the template names (``{a[0]}`` and ``{a.b}`` name ``a``)."""
        if self.template is None:
            return []
        fields = [f for _, f, _, _ in string.Formatter().parse(self.template) if f]
        return list(dict.fromkeys(f.split(".")[0].split("[")[0] for f in fields))

    def build(self, row: dict) -> str | list[dict]:
        """The prompt of one row: a string, or chat messages."""
        if self.template is not None:
            content = self.template.format_map(row)
        else:
            content = row[self.column]
        if isinstance(content, list):  # chat messages in the data: the system prompt goes first
            if self.system_prompt is None:
                return content
            return [{"role": "system", "content": self.system_prompt}, *content]
        content = str(content)
        if self.as_chat:
            system = [] if self.system_prompt is None else [{"role": "system", "content": self.system_prompt}]
            return [*system, {"role": "user", "content": content}]
        return content if self.system_prompt is None else f"{self.system_prompt}\n\n{content}"

    def apply(self, rows: list[dict], name: str = "train_dataset") -> list[dict]:
        """``rows`` with each prompt built into ``column`` (new dicts; the other columns unchanged)."""
        if not self.active:
            return rows
        needed = self.columns() if self.template is not None else [self.column]
        out = []
        for i, row in enumerate(rows):
            if not isinstance(row, dict):
                return rows  # load_rows names the bad row
            missing = [c for c in needed if c not in row]
            if missing:
                raise DataError(_missing_message(name, i, row, missing[0], self.template is not None))
            if self.chat is False and isinstance(row.get(self.column), list) and self.template is None:
                raise DataError(
                    f"{name} row {i}: {self.column!r} holds chat messages but use_chat_template is false; set it to "
                    "true (or null), or give plain string prompts."
                )
            if any(isinstance(m, dict) and m.get("role") == "system" for m in _messages(row, self)):
                raise DataError(
                    f"{name} row {i} has a system message already and system_prompt is set; drop one of them."
                )
            try:
                out.append({**row, self.column: self.build(row)})
            except (KeyError, IndexError, AttributeError, ValueError) as exc:
                raise DataError(f"{name} row {i}: prompt_template {self.template!r} failed on it ({exc!r}).") from None
        return out


def _messages(row: dict, builder: PromptBuilder) -> list:
    """The chat messages a row brings (its prompt column, when no template replaces it) if a system prompt is added."""
    if builder.system_prompt is None or builder.template is not None:
        return []
    prompt = row.get(builder.column)
    return prompt if isinstance(prompt, list) else []


def _missing_message(name: str, i: int, row: dict, column: str, template: bool) -> str:
    keys = ", ".join(map(repr, row)) or "none"
    close = difflib.get_close_matches(column, [str(k) for k in row], n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    if template:
        return (
            f"prompt_template names the column {column!r}, which {name} row {i} lacks (columns: {keys}); name one of "
            f"its columns in braces.{hint}"
        )
    return (
        f"{name} row {i} has no {column!r} column (columns: {keys}); set data.prompt_column to the column that holds "
        f"the prompt, or build it with data.prompt_template.{hint}"
    )
