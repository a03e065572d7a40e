"""`grpokit inspect RUN --tokens`: the per-token values the store kept (``run.store_token_values``), one table per
completion: each token as decoded, with its values (grpokit/store/token_values.py)."""

from __future__ import annotations

import json
import math

from rich.table import Table
from rich.text import Text

from grpokit.store.store import RolloutStore

MAX_COMPLETIONS = 8  # completions printed without --json


def tokens_text(store: RolloutStore, step: int | None, prompt: int | None, as_json: bool, print_: callable) -> str:
    """The completions (of ``step``, of ``prompt``) with per-token values: a table each (the first
    :data:`MAX_COMPLETIONS`), or JSON; a line saying so when the store has none."""
    names = store.token_value_names()
    if not names:
        return "no per-token values in this store: set run.store_token_values (e.g. [all]) to keep them\n"
    items = [i for i in store.token_values(step) if prompt is None or i["prompt_index"] == prompt]
    if as_json:
        clean = [{k: _json_safe(v) for k, v in i.items()} for i in items]
        return json.dumps(clean, ensure_ascii=False, indent=1) + "\n"
    if not items:
        return "no completions with per-token values match\n"
    out = []
    for item in items[:MAX_COMPLETIONS]:
        table = Table(title=f"step {item['step']} · prompt {item['prompt_index']} · #{item['completion_index']}")
        table.add_column("token")
        for name in names:
            table.add_column(name, justify="right")
        for t, token in enumerate(item["tokens"]):
            table.add_row(Text(repr(token)), *(_short(item[name][t]) for name in names))
        out.append(print_(table))
    left = len(items) - MAX_COMPLETIONS
    if left > 0:
        out.append(f"... and {left} more completions (--step, --prompt or --json)\n")
    return "".join(out)


def _short(value: float) -> str:
    return "nan" if math.isnan(value) else f"{value:.4g}"


def _json_safe(value):
    if isinstance(value, list):
        return [None if isinstance(v, float) and math.isnan(v) else v for v in value]
    return value
