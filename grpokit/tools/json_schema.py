"""Tools as JSON schemas, and checking a call's arguments against them.

A tool is a plain Python function (sync or async) with a type hint on every argument and a
Google-style docstring whose ``Args:`` section describes each one, as transformers' chat templates
take them (``apply_chat_template(tools=[...])``, see
https://huggingface.co/docs/transformers/chat_extras#passing-tools). :func:`tool_schema` uses
transformers' own converter (``transformers.utils.get_json_schema``), so the schema the model sees
in its prompt is the one :func:`check_arguments` checks its calls against.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any


class ToolError(ValueError):
    """A tool or environment is unusable as given (no schema, a duplicate name, no ``reset``)."""


_HOW = (
    "give every argument a type hint and write a Google-style docstring: a one-line description, then an "
    "`Args:` section with one `name: description` line per argument (transformers' get_json_schema format, "
    "https://huggingface.co/docs/transformers/chat_extras#passing-tools)"
)


def _where(fn: Callable) -> str:
    module = getattr(fn, "__module__", None) or "?"
    qualname = getattr(fn, "__qualname__", None) or type(fn).__name__
    return f"{module}.{qualname}"


def tool_schema(fn: Callable) -> dict[str, Any]:
    """The JSON schema of one tool, ``{"type": "function", "function": {"name", "description",
    "parameters", ...}}``; a :class:`ToolError` naming the function and the fix when it has none."""
    from transformers.utils import get_json_schema

    if not callable(fn):
        raise ToolError(f"a tool must be a function, got {fn!r} ({type(fn).__name__})")
    try:
        return get_json_schema(fn)
    except Exception as exc:  # transformers raises DocstringParsingException / TypeHintParsingException / others
        raise ToolError(f"tool {_where(fn)} cannot be described to the model: {exc}. Fix: {_HOW}.") from exc


def tool_schemas(tools: Sequence[Callable]) -> list[dict[str, Any]]:
    """The schemas of ``tools`` in order; two tools with the same name are a :class:`ToolError`."""
    schemas = [tool_schema(fn) for fn in tools]
    seen: dict[str, Callable] = {}
    for fn, schema in zip(tools, schemas):
        name = schema["function"]["name"]
        if name in seen:
            raise ToolError(
                f"two tools are named {name!r} ({_where(seen[name])} and {_where(fn)}); the model calls tools by "
                "name, so rename one"
            )
        seen[name] = fn
    return schemas


_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "array": (list, tuple),
    "object": (dict,),
    "null": (type(None),),
}


def _type_error(value: Any, spec: Mapping[str, Any]) -> str | None:
    """Why ``value`` does not fit the JSON-schema fragment ``spec``, or None when it does."""
    if value is None and spec.get("nullable"):
        return None
    if "enum" in spec and value not in spec["enum"]:
        return f"must be one of {list(spec['enum'])}, got {value!r}"
    types = spec.get("type")
    if types is None:
        return None
    types = [types] if isinstance(types, str) else list(types)
    for name in types:
        allowed = _JSON_TYPES.get(name)
        if allowed is None:
            return None  # a type this check does not know: let the tool decide
        # bool is an int in Python, but true is not a number in JSON
        if isinstance(value, allowed) and not (isinstance(value, bool) and name in ("integer", "number")):
            if name == "array" and isinstance(spec.get("items"), Mapping):
                for i, item in enumerate(value):
                    why = _type_error(item, spec["items"])
                    if why is not None:
                        return f"item {i} {why}"
            return None
    return f"must be {' or '.join(types)}, got {type(value).__name__} {value!r}"


def check_arguments(schema: Mapping[str, Any], arguments: Mapping[str, Any]) -> str | None:
    """Why ``arguments`` are not a valid call of the tool ``schema`` describes (a missing required
    argument, an unknown one, a value of the wrong JSON type), or None when they are."""
    function = schema.get("function", schema)
    parameters = function.get("parameters") or {}
    properties = parameters.get("properties") or {}
    missing = [name for name in parameters.get("required", []) if name not in arguments]
    if missing:
        return f"missing required argument{'s' if len(missing) > 1 else ''} {', '.join(map(repr, missing))}"
    unknown = [name for name in arguments if name not in properties]
    if unknown:
        return (
            f"unknown argument{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))} "
            f"(it takes {', '.join(map(repr, properties)) or 'no arguments'})"
        )
    for name, value in arguments.items():
        why = _type_error(value, properties[name])
        if why is not None:
            return f"argument {name!r} {why}"
    return None
