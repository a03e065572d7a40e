"""What ``grpokit serve-rewards`` accepts (:mod:`grpokit.rewards.serve`): request bodies read and checked at every
level before a reward sees them. Anything else is a :class:`BadRequest`, answered with its 4xx status and a JSON
``{"error": reason}`` naming the problem and what was expected.

- the body: UTF-8 JSON (no NaN or Infinity), nested at most ``MAX_DEPTH`` levels;
- grpokit's format: an object with ``completions`` (a list), ``prompts`` (optional; one per completion) and
  ``columns`` (optional; an object of lists, one value per completion, not named as the call's own keywords but
  ``completion_ids``, lists of token ids, which grpokit's client sends as TRL passes them); each
  prompt and completion a string or a list of ``{"role": str, "content": ...}`` messages; no other keys;
- OpenRLHF's: an object with ``query`` (a list of strings), ``prompts`` and ``labels`` (optional, one per query; other
  keys are ignored, as OpenRLHF's versions add some).
"""

from __future__ import annotations

import json
from typing import Any

MAX_DEPTH = 32
GRPOKIT_KEYS = ("prompts", "completions", "columns")
RESERVED_COLUMNS = (
    "prompts",
    "completions",
    "trainer_state",
    "log_metric",
    "log_extra",
    "log_errors",
    "environments",
)


class BadRequest(Exception):
    """A client's mistake: ``status`` (4xx, or 503 for a full queue) and the reason sent back."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.headers = headers or {}


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")


def _depth(value: Any) -> int:
    """How deeply ``value`` nests lists and objects (a scalar: 0), without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is not None:
            deepest = max(deepest, level)
            if level > MAX_DEPTH:
                return level
            stack.extend((child, level + 1) for child in children)
    return deepest


def parse_body(data: bytes) -> Any:
    """The JSON value of a request body; BadRequest when it is not UTF-8 JSON nested at most MAX_DEPTH deep."""
    if not data.strip():
        raise BadRequest(400, "the body is empty: send a JSON object (docs/rewards.md, 'Remote rewards')")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadRequest(400, f"the body is not UTF-8 ({exc.reason} at byte {exc.start})") from None
    try:
        value = json.loads(text, parse_constant=_no_constant)
    except RecursionError:
        raise BadRequest(400, f"the body nests lists or objects deeper than {MAX_DEPTH} levels") from None
    except ValueError as exc:
        raise BadRequest(400, f"the body is not JSON: {exc}") from None
    if _depth(value) > MAX_DEPTH:
        raise BadRequest(400, f"the body nests lists or objects deeper than {MAX_DEPTH} levels")
    return value


def _kind(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), "a number"
    )


def _message_ok(message: Any) -> bool:
    return (
        isinstance(message, dict)
        and isinstance(message.get("role"), str)
        and isinstance(message.get("content"), (str, list))
    )


def _texts(value: Any, what: str) -> list:
    """A list of prompts or completions: each a string or a list of chat messages."""
    if not isinstance(value, list):
        raise BadRequest(400, f"'{what}' must be a list, got {_kind(value)}")
    for i, item in enumerate(value):
        if not isinstance(item, str) and not (isinstance(item, list) and all(_message_ok(m) for m in item)):
            raise BadRequest(
                400,
                f'\'{what}\'[{i}] must be a string or a list of {{"role": string, "content": string}} messages, '
                f"got {_kind(item)}",
            )
    return value


def _one_each(value: Any, what: str, n: int) -> list:
    if not isinstance(value, list):
        raise BadRequest(400, f"'{what}' must be a list with one value per completion ({n}), got {_kind(value)}")
    if len(value) != n:
        raise BadRequest(400, f"'{what}' has {len(value)} values for {n} completions: give one per completion")
    return value


def grpokit_request(body: Any) -> tuple[list, list, dict[str, list]]:
    """(prompts, completions, columns) of a grpokit-format request (module docstring)."""
    if not isinstance(body, dict):
        raise BadRequest(
            400, f'a grpokit request is an object {{"prompts", "completions", "columns"}}, got {_kind(body)}'
        )
    unknown = sorted(set(body) - set(GRPOKIT_KEYS))
    if unknown:
        raise BadRequest(400, f"unknown key {unknown[0]!r}: a grpokit request has 'prompts', 'completions', 'columns'")
    if "completions" not in body:
        raise BadRequest(400, "the request has no 'completions': a list of strings (or chat messages)")
    completions = _texts(body["completions"], "completions")
    n = len(completions)
    prompts = [""] * n if body.get("prompts") is None else _texts(body["prompts"], "prompts")
    if len(prompts) != n:
        raise BadRequest(400, f"'prompts' has {len(prompts)} values for {n} completions: give one per completion")
    columns = {} if body.get("columns") is None else body["columns"]
    if not isinstance(columns, dict):
        raise BadRequest(400, f"'columns' must be an object {{name: [one value per completion]}}, got {_kind(columns)}")
    for name, values in columns.items():
        if name in RESERVED_COLUMNS:
            raise BadRequest(400, f"column {name!r} is a keyword of the reward call: rename it")
        _one_each(values, f"columns.{name}", n)
    ids = columns.get("completion_ids", [])  # grpokit's client sends the token ids, as TRL passes them
    if not all(isinstance(row, list) and all(type(t) is int for t in row) for row in ids):
        raise BadRequest(400, "'columns.completion_ids' must hold a list of token ids (integers) per completion")
    return prompts, completions, columns


def openrlhf_request(body: Any) -> tuple[list[str], list[str], dict[str, list]]:
    """(prompts, completions, columns) of an OpenRLHF-format request: each completion is its query after its prompt
    (the whole query when the prompt does not start it); labels reach the functions as ``label`` and ``answer``."""
    if not isinstance(body, dict):
        raise BadRequest(400, f'an OpenRLHF request is an object {{"query", "prompts", "labels"}}, got {_kind(body)}')
    if "query" not in body:
        raise BadRequest(400, "the request has no 'query': a list of strings (prompt + completion)")
    queries = body["query"]
    if not isinstance(queries, list) or not all(isinstance(q, str) for q in queries):
        raise BadRequest(400, "'query' must be a list of strings (prompt + completion)")
    n = len(queries)
    prompts = [""] * n if body.get("prompts") is None else _one_each(body["prompts"], "prompts", n)
    if not all(isinstance(p, str) for p in prompts):
        raise BadRequest(400, "'prompts' must be a list of strings")
    completions = [q[len(p) :] if q.startswith(p) else q for q, p in zip(queries, prompts)]
    labels = body.get("labels")
    columns = {} if labels is None else {"label": _one_each(labels, "labels", n)}
    if labels is not None:
        columns["answer"] = labels  # most built-ins read the answer column
    return prompts, completions, columns
