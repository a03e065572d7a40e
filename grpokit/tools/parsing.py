"""Tool calls parsed from what the model wrote, one parser per chat-template format.

A parser takes the text of one assistant turn, decoded with special tokens kept (``[TOOL_CALLS]``
and ``<|python_tag|>`` are special tokens, which ``skip_special_tokens=True`` would drop), and
returns its :class:`ToolCall` s in order. A call the model botched (bad JSON, no name, an
unclosed tag) is still returned, with ``error`` saying what is wrong, so the rollout can tell the
model instead of raising. :func:`validate_calls` then checks each call against the tools' schemas
(unknown tool, missing or unknown argument, wrong type).

Built-in formats, as the chat templates render a call (TRL 1.16's ``chat_templates/`` and the
models' own templates):

- ``hermes``: Qwen2.5, Qwen3, Hermes: ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``,
  one block per call.
- ``qwen3_xml``: Qwen3.5+, Nemotron 3: ``<tool_call>\\n<function=NAME>\\n<parameter=KEY>\\nVALUE\\n</parameter>
  \\n</function>\\n</tool_call>``; values are text, typed from the tool's schema by :func:`validate_calls`.
- ``llama3``: Llama 3.1 / 3.2: the whole turn is ``{"name": ..., "parameters": {...}}`` (optionally
  after ``<|python_tag|>``), or a built-in tool call ``<|python_tag|>NAME.call(key="value")``.
- ``mistral``: ``[TOOL_CALLS] [{"name": ..., "arguments": {...}, "id": ...}]`` (v3 tokenizer: Mistral 7B
  v0.3, Nemo) and ``[TOOL_CALLS]NAME[ARGS]{...}`` (v11+: Mistral Small 3.2, Magistral, Devstral).

:func:`register_tool_parser` adds a format (and how to recognise its chat template);
:func:`tool_parser_for` picks the parser from a tokenizer's chat template.
"""

from __future__ import annotations

import ast
import contextlib
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from grpokit.system.registry import Registry
from grpokit.tools.json_schema import ToolError, check_arguments


@dataclass(frozen=True)
class ToolCall:
    """One call the model wrote: the tool's ``name`` and its ``arguments``, the ``raw`` text of the
    call at ``text[start:end]``, and ``error`` when it is malformed (then it is not run; the model is
    told). ``id``: the call id the model wrote (Mistral). ``text_arguments``: the values are the raw
    text the format carries (``qwen3_xml``), not yet typed."""

    name: str | None
    arguments: dict[str, Any]
    raw: str
    start: int
    end: int
    error: str | None = None
    id: str | None = None
    text_arguments: bool = field(default=False, repr=False)

    def as_message_call(self) -> dict[str, Any]:
        """The call as a chat message's ``tool_calls`` entry (what ``apply_chat_template`` renders)."""
        call: dict[str, Any] = {"type": "function", "function": {"name": self.name, "arguments": self.arguments}}
        if self.id is not None:
            call["id"] = self.id
        return call


ToolParser = Callable[[str], list[ToolCall]]


def _call(text: str, start: int, end: int, name=None, arguments=None, error=None, **kw) -> ToolCall:
    return ToolCall(name, dict(arguments or {}), text[start:end], start, end, error, **kw)


def _json_call(obj: Any, arg_keys: Sequence[str]) -> tuple[str | None, dict, str | None]:
    """(name, arguments, error) of a decoded ``{"name": ..., "<arg key>": {...}}`` object."""
    if not isinstance(obj, dict):
        return None, {}, f"a tool call must be a JSON object with a name, got {type(obj).__name__}"
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return None, {}, 'the tool call has no "name" string'
    key = next((k for k in arg_keys if k in obj), None)
    arguments = {} if key is None else obj[key]
    if isinstance(arguments, str):  # some models write the arguments as a JSON string
        with contextlib.suppress(json.JSONDecodeError):
            arguments = json.loads(arguments)
    if not isinstance(arguments, dict):
        return name, {}, f'the "{key}" of the tool call must be a JSON object, got {type(arguments).__name__}'
    return name, arguments, None


def _bad_json(exc: json.JSONDecodeError) -> str:
    return f"the tool call is not valid JSON ({exc.msg} at character {exc.pos})"


_HERMES = re.compile(r"<tool_call>(.*?)(</tool_call>|\Z)", re.S)


def parse_hermes(text: str) -> list[ToolCall]:
    """``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks (Qwen2.5, Qwen3, Hermes)."""
    calls = []
    for m in _HERMES.finditer(text):
        if not m.group(2):
            calls.append(_call(text, m.start(), m.end(), error="the tool call is not closed with </tool_call>"))
            continue
        try:
            obj = json.loads(m.group(1))
        except json.JSONDecodeError as exc:
            calls.append(_call(text, m.start(), m.end(), error=_bad_json(exc)))
            continue
        name, arguments, error = _json_call(obj, ("arguments", "parameters"))
        calls.append(_call(text, m.start(), m.end(), name, arguments, error))
    return calls


_XML_FUNCTION = re.compile(r"\s*<function=([^>\n]+)>(.*?)</function>\s*\Z", re.S)
_XML_PARAMETER = re.compile(r"<parameter=([^>\n]+)>\n?(.*?)\n?</parameter>", re.S)


def parse_qwen3_xml(text: str) -> list[ToolCall]:
    """``<tool_call><function=NAME><parameter=KEY>VALUE</parameter></function></tool_call>`` blocks
    (Qwen3.5+, Nemotron 3); the values stay text until :func:`validate_calls` types them."""
    calls = []
    for m in _HERMES.finditer(text):
        if not m.group(2):
            calls.append(_call(text, m.start(), m.end(), error="the tool call is not closed with </tool_call>"))
            continue
        function = _XML_FUNCTION.match(m.group(1))
        if function is None:
            error = "a tool call must be <function=NAME>...</function> inside <tool_call></tool_call>"
            calls.append(_call(text, m.start(), m.end(), error=error))
            continue
        arguments = {key.strip(): value for key, value in _XML_PARAMETER.findall(function.group(2))}
        calls.append(_call(text, m.start(), m.end(), function.group(1).strip(), arguments, text_arguments=True))
    return calls


_LLAMA_END = re.compile(r"(?:<\|eot_id\|>|<\|eom_id\|>)\s*\Z")
_PYTHON_TAG = "<|python_tag|>"
_BUILTIN = re.compile(r"([A-Za-z_]\w*)\.call\((.*)\)\s*\Z", re.S)


def _builtin_call(text: str, start: int, end: int, name: str, args: str) -> ToolCall:
    """``NAME.call(key="value", ...)``: Llama 3.1's built-in tool form, keyword literals only."""
    try:
        node = ast.parse(f"f({args})", mode="eval").body
        if node.args:
            raise ValueError("positional arguments")
        arguments = {kw.arg: ast.literal_eval(kw.value) for kw in node.keywords}
        if None in arguments:
            raise ValueError("**kwargs")
    except (SyntaxError, ValueError) as exc:
        error = f'the call {name}.call(...) must take key="value" arguments only ({exc})'
        return _call(text, start, end, name, error=error)
    return _call(text, start, end, name, arguments)


def parse_llama3(text: str) -> list[ToolCall]:
    """A turn that is ``{"name": ..., "parameters": {...}}`` (several separated by ``;`` are taken in
    turn), optionally after ``<|python_tag|>``, or ``<|python_tag|>NAME.call(...)`` (Llama 3.1 / 3.2)."""
    end_of_turn = _LLAMA_END.search(text)
    stop = end_of_turn.start() if end_of_turn else len(text)
    tag = text.find(_PYTHON_TAG)
    pos = tag + len(_PYTHON_TAG) if tag >= 0 else len(text) - len(text.lstrip())
    while pos < stop and text[pos].isspace():
        pos += 1
    body = text[pos:stop]
    if tag >= 0:
        builtin = _BUILTIN.match(body)
        if builtin is not None:
            return [_builtin_call(text, tag, stop, builtin.group(1), builtin.group(2))]
    if not body.startswith("{"):
        if tag >= 0:
            error = 'after <|python_tag|> a tool call is {"name": ..., "parameters": {...}} or NAME.call(...)'
            return [_call(text, tag, stop, error=error)]
        return []  # plain prose: an answer, not a call
    calls = []
    decoder = json.JSONDecoder()
    first = tag if tag >= 0 else pos
    while pos < stop:
        try:
            obj, after = decoder.raw_decode(text[:stop], pos)
        except json.JSONDecodeError as exc:
            if not calls and tag < 0 and '"name"' not in body:
                return []  # prose that happens to start with a brace
            calls.append(_call(text, first if not calls else pos, stop, error=_bad_json(exc)))
            break
        name, arguments, error = _json_call(obj, ("parameters", "arguments"))
        if not calls and tag < 0 and name is None:
            return []  # a JSON answer, not a call
        calls.append(_call(text, first if not calls else pos, after, name, arguments, error))
        pos = after
        while pos < stop and (text[pos].isspace() or text[pos] == ";"):
            pos += 1
    return calls


_MISTRAL_TAG = "[TOOL_CALLS]"
_MISTRAL_V11 = re.compile(r"\s*([A-Za-z_][\w.-]*)(?:\[CALL_ID\](\w+))?\[ARGS\]")


def parse_mistral(text: str) -> list[ToolCall]:
    """``[TOOL_CALLS] [{"name": ..., "arguments": {...}, "id": ...}, ...]`` (v3 tokenizer) or
    ``[TOOL_CALLS]NAME[ARGS]{...}`` (v11+, one tag per call)."""
    calls = []
    decoder = json.JSONDecoder()
    start = text.find(_MISTRAL_TAG)
    while start >= 0:
        pos = start + len(_MISTRAL_TAG)
        nxt = text.find(_MISTRAL_TAG, pos)
        stop = len(text) if nxt < 0 else nxt
        while pos < stop and text[pos].isspace():
            pos += 1
        v11 = _MISTRAL_V11.match(text, pos, stop)
        try:
            if v11 is not None:
                obj, end = decoder.raw_decode(text[:stop], v11.end())
                if not isinstance(obj, dict):
                    error = f"the arguments after [ARGS] must be a JSON object, got {type(obj).__name__}"
                    calls.append(_call(text, start, end, v11.group(1), error=error))
                else:
                    calls.append(_call(text, start, end, v11.group(1), obj, id=v11.group(2)))
            else:
                items, end = decoder.raw_decode(text[:stop], pos)
                if not isinstance(items, list):
                    items = [items]  # a single object without the list brackets
                for item in items:
                    name, arguments, error = _json_call(item, ("arguments", "parameters"))
                    call_id = item.get("id") if isinstance(item, dict) else None
                    calls.append(_call(text, start, end, name, arguments, error, id=call_id))
        except json.JSONDecodeError as exc:
            calls.append(_call(text, start, stop, error=_bad_json(exc)))
        start = nxt
    return calls


@dataclass(frozen=True)
class _Entry:
    parser: ToolParser
    detect: Callable[[str], bool] | None


# the tool-call formats by name: @TOOL_PARSERS.register(name, detect=...) on a parser (or register_tool_parser)
TOOL_PARSERS = Registry("tool-call parser", entry=lambda name, parser, detect=None: _Entry(parser, detect))


def register_tool_parser(
    name: str, parser: ToolParser, detect: Callable[[str], bool] | None = None, *, overwrite: bool = False
) -> None:
    """Add a tool-call format: ``parser(text) -> list[ToolCall]``, and ``detect(chat_template) ->
    bool`` saying whether a chat template writes calls this way (checked before the built-ins, the
    most recently registered first). An existing name is refused unless ``overwrite=True``."""
    if name in TOOL_PARSERS and not overwrite:
        raise ToolError(f"a tool-call parser named {name!r} is registered already; pass overwrite=True to replace it")
    if not callable(parser):
        raise ToolError(f"the tool-call parser {name!r} must be a function text -> list[ToolCall], got {parser!r}")
    TOOL_PARSERS.pop(name, None)  # the most recently registered is detected first
    TOOL_PARSERS.register(name, detect=detect, overwrite=True)(parser)


def tool_parser_names() -> list[str]:
    return list(TOOL_PARSERS)


def get_tool_parser(name: str) -> ToolParser:
    """The parser registered as ``name``; a :class:`ToolError` listing the known names otherwise."""
    entry = TOOL_PARSERS.get(name)
    if entry is None:
        raise ToolError(
            f"unknown tool-call parser {name!r}; known: {', '.join(TOOL_PARSERS)} "
            "(grpokit.tools.register_tool_parser adds one)"
        )
    return entry.parser


def _template_text(source: Any) -> str:
    """The chat template of a tokenizer (all named templates of a dict joined), or the string given."""
    template = source if isinstance(source, (str, Mapping)) else getattr(source, "chat_template", None)
    if isinstance(template, Mapping):
        template = "\n".join(str(t) for t in template.values())
    if not template:
        raise ToolError(
            "the tokenizer has no chat template, so its tool-call format is unknown; set tokenizer.chat_template "
            f"or name the parser ({', '.join(TOOL_PARSERS)})"
        )
    return template


def tool_parser_for(source: Any) -> str:
    """The name of the parser for the tool calls a tokenizer's chat template (or the template string
    ``source``) renders; a :class:`ToolError` naming the fix when no registered format matches."""
    template = _template_text(source)
    for name in reversed(TOOL_PARSERS):
        detect = TOOL_PARSERS[name].detect
        if detect is not None and detect(template):
            return name
    raise ToolError(
        "cannot tell the tool-call format from this chat template: it matches none of the known formats; name "
        f"the parser ({', '.join(TOOL_PARSERS)}) if one fits, or add one with "
        "grpokit.tools.register_tool_parser(name, parser, detect)"
    )


def parse_tool_calls(text: str, parser: str | ToolParser) -> list[ToolCall]:
    """The calls in ``text`` by the parser named ``parser`` (or the parser function itself)."""
    return (get_tool_parser(parser) if isinstance(parser, str) else parser)(text)


def _is_llama3(template: str) -> bool:
    return "<|python_tag|>" in template or ('"parameters"' in template and "<|start_header_id|>" in template)


# Registered in reverse order of precedence: detection tries the most recent first, so the XML form
# (whose templates also contain <tool_call>) is recognised before Hermes.
TOOL_PARSERS.register("llama3", detect=_is_llama3)(parse_llama3)
TOOL_PARSERS.register("mistral", detect=lambda t: "[TOOL_CALLS]" in t)(parse_mistral)
TOOL_PARSERS.register("hermes", detect=lambda t: "<tool_call>" in t and "<arg_key>" not in t)(parse_hermes)
TOOL_PARSERS.register("qwen3_xml", detect=lambda t: "<tool_call>" in t and "<function=" in t)(parse_qwen3_xml)


def _typed(value: str, spec: Mapping[str, Any]) -> Any:
    """A text argument value as the JSON type its schema names (the text itself when it does not parse)."""
    types = spec.get("type")
    types = [types] if isinstance(types, str) else list(types or [])
    if types == ["string"] or (not types and "enum" not in spec):
        return value
    stripped = value.strip()
    if stripped in ("True", "False"):  # Jinja's `string` filter renders Python booleans
        stripped = stripped.lower()
    try:
        return json.loads(stripped)
    except json.JSONDecodeError:
        return value


def validate_calls(calls: Sequence[ToolCall], schemas: Sequence[Mapping[str, Any]]) -> list[ToolCall]:
    """``calls`` checked against the available tools' ``schemas``: each call that names no known tool
    or whose arguments do not fit gets its ``error``; text arguments are typed from the schema."""
    by_name = {s.get("function", s)["name"]: s for s in schemas}
    checked = []
    for call in calls:
        if call.error is not None:
            checked.append(call)
            continue
        schema = by_name.get(call.name)
        if schema is None:
            known = ", ".join(map(repr, by_name)) or "none"
            checked.append(replace(call, error=f"there is no tool named {call.name!r} (the tools are: {known})"))
            continue
        if call.text_arguments:
            properties = schema.get("function", schema).get("parameters", {}).get("properties", {})
            typed = {k: _typed(v, properties[k]) if k in properties else v for k, v in call.arguments.items()}
            call = replace(call, arguments=typed, text_arguments=False)
        why = check_arguments(schema, call.arguments)
        checked.append(call if why is None else replace(call, error=f"wrong arguments for {call.name!r}: {why}"))
    return checked


def assistant_message(text: str, calls: Sequence[ToolCall]) -> dict[str, Any]:
    """The assistant turn as a chat message: ``content`` is ``text`` without the calls' spans, and
    ``tool_calls`` the well-formed calls (what a reward function or a re-render sees)."""
    content, pos = [], 0
    for call in sorted(calls, key=lambda c: c.start):
        content.append(text[pos : call.start])
        pos = max(pos, call.end)
    content.append(text[pos:])
    message: dict[str, Any] = {"role": "assistant", "content": "".join(content).strip()}
    good = [call.as_message_call() for call in calls if call.error is None]
    if good:
        message["tool_calls"] = good
    return message
