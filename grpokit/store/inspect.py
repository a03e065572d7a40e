"""`grpokit inspect RUN`: the rollout store of a run as a table (or JSON).

Without options: one line per step (n, mean reward, mean length, errors). With --step, --top,
--bottom, --prompt or --errors: the matching completions (a multi-turn rollout as its conversation: the
model's turns and each tool call's result, and each image of its prompt: its sha256, size and file). With --sql: any
read-only query.
"""

from __future__ import annotations

import io
import json
import math
import shutil
from pathlib import Path
from typing import Any

from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from grpokit.store.store import RolloutStore, StoreError, resolve_store_path

# Completions are often long; the table shows their start and --json gives them whole.
_MAX_COMPLETION_CHARS = 600
_MAX_PROMPT_CHARS = 200


def inspect_run(
    run_dir: str | Path,
    *,
    step: int | None = None,
    top: int | None = None,
    bottom: int | None = None,
    prompt: int | None = None,
    errors: bool = False,
    sql: str | None = None,
    as_json: bool = False,
    tokens: bool = False,
    prompts: bool = False,
    sort: str = "prompt",
) -> str:
    """Render what `grpokit inspect` prints for the run in `run_dir`.

    `top` / `bottom` keep the K highest / lowest rewarded completions (of `step` if given),
    `prompt` keeps one prompt_index, `errors` keeps completions whose reward raised. `tokens` prints the
    per-token values the store kept (of `step`, of `prompt`) instead; `prompts` each training prompt's history
    (store/inspect_prompts.py), sorted by ``sort``.
    """
    if top is not None and bottom is not None:
        raise StoreError("choose either --top or --bottom, not both")
    selects_rollouts = (step, top, bottom, prompt) != (None,) * 4 or errors
    if sql is not None and selects_rollouts:
        raise StoreError("--sql cannot be combined with the other selection options")
    if prompts and (selects_rollouts or sql is not None or tokens):
        raise StoreError("--prompts lists every prompt's history; drop --step/--top/--bottom/--prompt/--errors/--sql")
    run_dir = Path(run_dir)
    if not run_dir.exists():
        raise StoreError(f"no run folder at {run_dir}")
    with RolloutStore(resolve_store_path(run_dir), readonly=True) as store:
        if tokens:
            from grpokit.store.inspect_tokens import tokens_text

            return tokens_text(store, step, prompt, as_json, _print)
        if prompts:
            from grpokit.store.inspect_prompts import prompts_text

            return prompts_text(store, f"{run_dir.name}: prompts", as_json, _render, sort)
        if sql is not None:
            columns, rows = store.query(sql)
            return _render(columns, [dict(zip(columns, row)) for row in rows], as_json, title="query")
        if not selects_rollouts:
            rows = store.summary()
            columns = ["step", "n", "mean_reward", "mean_length", "errors"]
            return _render(columns, rows, as_json, title=f"{run_dir.name}: steps")
        order = "desc" if top is not None else "asc" if bottom is not None else None
        rollouts = store.rollouts(
            step=step,
            prompt_index=prompt,
            errors_only=errors,
            order_by_reward=order,
            limit=top if top is not None else bottom,
        )
        _describe_images(store, rollouts)
    if as_json:
        return _to_json(rollouts)
    return _render_rollouts(rollouts)


def _render(columns: list[str], rows: list[dict], as_json: bool, title: str) -> str:
    if as_json:
        return _to_json(rows)
    table = Table(title=title)
    for name in columns:
        table.add_column(name, justify="right" if _is_numeric_column(rows, name) else "left")
    for row in rows:
        table.add_row(*(Text(_format(row[name])) for name in columns))
    return _print(table)


def _render_rollouts(rollouts: list[dict]) -> str:
    # One panel per completion rather than a table row: completions are long, and a table with
    # ten numeric columns leaves them a sliver of the terminal.
    if not rollouts:
        return "no completions match\n"
    panels = []
    for r in rollouts:
        rewards = ", ".join(f"{name} {_format(v)}" for name, v in sorted(r["rewards"].items()))
        title = (
            f"step {r['step']} · prompt {r['prompt_index']} · #{r['completion_index']} · "
            f"reward {_format(r['reward'])} ({rewards}) · advantage "
            f"{_format(r['advantage'])} · {r['completion_tokens']} tokens · "
            f"{r['finish_reason']}"
        )
        # Text(), not str: a completion containing "[bold]" must print as written, not as markup.
        body = Text()
        body.append(_shorten(r["prompt"], _MAX_PROMPT_CHARS), style="dim")
        for n, image in enumerate(r.get("images") or (), 1):
            body.append(_image_line(n, image), style="magenta")
        body.append("\n")
        if r.get("conversation"):
            _append_conversation(body, r["conversation"])
        else:
            body.append(_shorten(r["completion"], _MAX_COMPLETION_CHARS))
        for column, value in sorted((r.get("extra") or {}).items()):
            body.append(f"\n{column}: {_shorten(_format(value), _MAX_PROMPT_CHARS)}", style="cyan")
        if r["error"] is not None:
            body.append(f"\nerror: {r['error']}", style="red")
        panels.append(Panel(body, title=Text(title), title_align="left"))
    return _print(Group(*panels))


def _describe_images(store: RolloutStore, rollouts: list[dict]) -> None:
    """Each rollout's ``images`` (hashes) as dicts: sha256, bytes, width, height, file (the PNG's path, None when
    it was not kept: log_multimodal false or past store_images_max_mb), what the store says of them."""
    known = store.images(sorted({sha for r in rollouts for sha in r.get("images") or ()}))
    for r in rollouts:
        if r.get("images"):
            r["images"] = [_image(sha, known.get(sha)) for sha in r["images"]]


def _image(sha: str, row: dict | None) -> dict:
    if row is None:
        return {"sha256": sha, "bytes": None, "width": None, "height": None, "file": None}
    file = None if row["path"] is None else str(row["path"])
    return {"sha256": sha, "bytes": row["bytes"], "width": row["width"], "height": row["height"], "file": file}


def _image_line(n: int, image: dict) -> str:
    if image["bytes"] is None:
        return f"\nimage {n}: sha256 {image['sha256']} · not stored (log_multimodal: false)"
    size = f"{image['bytes']} bytes · {image['width']}x{image['height']} px"
    kept = "" if image["file"] else " · not stored (past store_images_max_mb)"  # kept: RUN/images/<sha256>.png
    return f"\nimage {n}: sha256 {image['sha256']} · {size}{kept}"


def _append_conversation(body: Text, conversation: dict) -> None:
    """A multi-turn rollout as its turns: the model's (tool calls included), each tool result with its call,
    status and time, then how it ended."""
    for turn in conversation["turns"]:
        if turn["role"] == "tool":
            arguments = json.dumps(turn.get("arguments") or {}, ensure_ascii=False)
            timing = f", {turn['duration']:.3g} s" if "duration" in turn else ""
            shown = "" if "tokens" in turn else ", not shown: no room left"
            body.append(f"\n[tool] {turn.get('name')}({arguments}) -> {turn.get('status')}{timing}{shown}: ", "cyan")
            body.append(_shorten(turn["text"], _MAX_PROMPT_CHARS), style="cyan")
            if turn.get("error"):
                body.append(f"\n  error: {turn['error']}", style="red")
        else:
            body.append(f"\n[{turn['role']}] ", style="bold")
            body.append(_shorten(turn["text"], _MAX_COMPLETION_CHARS))
    rounds = conversation["tool_rounds"]
    body.append(f"\nended: {conversation['stop_reason']} after {rounds} tool round{'s' * (rounds != 1)}", style="dim")


def _print(renderable: Any) -> str:
    width = max(100, shutil.get_terminal_size((120, 40)).columns)
    console = Console(file=io.StringIO(), width=width, color_system=None)
    console.print(renderable)
    return console.file.getvalue()


def _is_numeric_column(rows: list[dict], name: str) -> bool:
    values = [row[name] for row in rows if row[name] is not None]
    return bool(values) and all(isinstance(v, (int, float)) for v in values)


def _format(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{value:.4g}"
    return str(value)


def _shorten(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _to_json(rows: list[dict]) -> str:
    # Strict JSON has no NaN; a metric that was NaN reads as null.
    clean = [{k: None if isinstance(v, float) and math.isnan(v) else v for k, v in row.items()} for row in rows]
    return json.dumps(clean, indent=2, ensure_ascii=False) + "\n"
