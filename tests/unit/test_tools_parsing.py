"""Tool calls parsed from model text: each built-in format (checked against the chat templates that
render it), malformed calls as errors, schema checks, the parser registry and template detection."""

from __future__ import annotations

import pytest

from grpokit.tools import parsing
from grpokit.tools.json_schema import ToolError, tool_schemas
from grpokit.tools.parsing import (
    ToolCall,
    assistant_message,
    get_tool_parser,
    parse_tool_calls,
    register_tool_parser,
    tool_parser_for,
    validate_calls,
)


def multiply(a: int, b: int, note: str = "", flag: bool = False, xs: list[int] | None = None) -> int:
    """Multiply two integers.

    Args:
        a: The first factor.
        b: The second factor.
        note: A note.
        flag: A flag.
        xs: More numbers.
    """
    return a * b


def lookup(word: str) -> str:
    """Look a word up.

    Args:
        word: The word.
    """
    return word


SCHEMAS = tool_schemas([multiply, lookup])
ARGS = {"a": 12, "b": 34, "note": "x y", "flag": True, "xs": [1, 2]}
CALLS = [
    {"type": "function", "function": {"name": "multiply", "arguments": ARGS}},
    {"type": "function", "function": {"name": "lookup", "arguments": {"word": "cat"}}},
]


def _render(template: str, messages: list[dict], **kwargs) -> str:
    from transformers.utils.chat_template_utils import render_jinja_template

    out = render_jinja_template([messages], chat_template=template, bos_token="<s>", eos_token="</s>", **kwargs)
    while not isinstance(out, str):  # a tuple (rendered, generation indices) / list on some versions
        out = out[0]
    return out


def _assistant_text(template: str, calls: list[dict], content: str = "") -> str:
    """What the template renders for an assistant turn holding ``calls``: what the model is trained to write."""
    user = [{"role": "user", "content": "What is 12 times 34?"}]
    prompt = _render(template, user, add_generation_prompt=True)
    full = _render(template, [*user, {"role": "assistant", "content": content, "tool_calls": calls}])
    # Nemotron's generation prompt opens a <think> block the rendered turn closes at once: cut at the common prefix
    common = next((i for i, (a, b) in enumerate(zip(prompt, full)) if a != b), len(prompt))
    return full[common:]


@pytest.mark.parametrize(
    ("template", "parser", "n_calls"),
    [
        ("qwen2_5", "hermes", 2),
        ("qwen3", "hermes", 2),
        ("qwen3_5_nothink", "qwen3_xml", 2),
        ("qwen3_6", "qwen3_xml", 2),
        ("nemotron_3_nano", "qwen3_xml", 2),
        ("llama3_1", "llama3", 1),
        ("llama3_2", "llama3", 1),
    ],
)
def test_calls_rendered_by_real_chat_templates_parse_back(template, parser, n_calls):
    """The chat templates TRL ships render calls; the detected parser reads the same calls back."""
    from importlib import resources

    pytest.importorskip("trl", reason="the chat templates come from TRL (the bench extra)")
    text_of_template = (resources.files("trl") / "chat_templates" / f"{template}.jinja").read_text()
    assert tool_parser_for(text_of_template) == parser
    text = _assistant_text(text_of_template, CALLS[:n_calls])
    calls = validate_calls(parse_tool_calls(text, parser), SCHEMAS)
    assert [(c.name, c.arguments, c.error) for c in calls] == [
        (c["function"]["name"], c["function"]["arguments"], None) for c in CALLS[:n_calls]
    ]
    for call in calls:
        assert text[call.start : call.end] == call.raw
    assert "multiply" in calls[0].raw and "12" in calls[0].raw


def test_tool_parser_for_a_tokenizer_and_unknown_templates():
    class Tok:
        chat_template = "{{ '<|im_start|>' }}{% if tools %}<tool_call>{% endif %}"

    assert tool_parser_for(Tok()) == "hermes"
    assert tool_parser_for({"default": "plain", "tool_use": "[TOOL_CALLS]"}) == "mistral"
    with pytest.raises(ToolError, match=r"matches none of the known formats.*register_tool_parser"):
        tool_parser_for("{{ messages }}")
    with pytest.raises(ToolError, match="no chat template"):
        tool_parser_for(type("NoTemplate", (), {"chat_template": None})())
    # GLM-4's <tool_call>NAME<arg_key>... form is not Hermes: not guessed as such
    with pytest.raises(ToolError):
        tool_parser_for("<tool_call>{{ name }}<arg_key>k</arg_key>")


def test_hermes_content_and_calls():
    text = 'Let me compute.\n<tool_call>\n{"name": "lookup", "arguments": {"word": "dog"}}\n</tool_call><|im_end|>'
    (call,) = parse_tool_calls(text, "hermes")
    assert (call.name, call.arguments, call.error) == ("lookup", {"word": "dog"}, None)
    assert assistant_message(text[: text.index("<|im_end|>")], [call]) == {
        "role": "assistant",
        "content": "Let me compute.",
        "tool_calls": [{"type": "function", "function": {"name": "lookup", "arguments": {"word": "dog"}}}],
    }
    assert parse_tool_calls("The answer is 408.<|im_end|>", "hermes") == []
    # arguments written as a JSON string are accepted
    (call,) = parse_tool_calls(
        '<tool_call>{"name": "lookup", "arguments": "{\\"word\\": \\"x\\"}"}</tool_call>', "hermes"
    )
    assert call.arguments == {"word": "x"}


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ('<tool_call>\n{"name": "lookup", "arguments": {"word": "dog"}\n</tool_call>', "not valid JSON"),
        ('<tool_call>\n{"name": "lookup", "arguments": {"word": "dog"}}', "not closed with </tool_call>"),
        ('<tool_call>{"arguments": {"word": "dog"}}</tool_call>', 'no "name"'),
        ('<tool_call>{"name": "lookup", "arguments": [1]}</tool_call>', 'the "arguments" of the tool call must be'),
        ("<tool_call>[1, 2]</tool_call>", "must be a JSON object with a name, got list"),
    ],
)
def test_hermes_malformed_calls_are_errors(text, error):
    (call,) = parse_tool_calls(text, "hermes")
    assert call.error is not None and error in call.error
    assert call.raw == text
    assert "tool_calls" not in assistant_message(text, [call])


def test_qwen3_xml_values_are_typed_from_the_schema():
    text = (
        "<tool_call>\n<function=multiply>\n<parameter=a>\n12\n</parameter>\n<parameter=b>\nabc\n</parameter>\n"
        "<parameter=note>\n7\n</parameter>\n</function>\n</tool_call>"
    )
    (call,) = parse_tool_calls(text, "qwen3_xml")
    assert call.arguments == {"a": "12", "b": "abc", "note": "7"}  # text until checked
    (checked,) = validate_calls([call], SCHEMAS)
    assert checked.error == "wrong arguments for 'multiply': argument 'b' must be integer, got str 'abc'"
    (call,) = parse_tool_calls(text.replace("abc", "3"), "qwen3_xml")
    (checked,) = validate_calls([call], SCHEMAS)
    assert (checked.arguments, checked.error) == ({"a": 12, "b": 3, "note": "7"}, None)  # note stays a string
    (bad,) = parse_tool_calls("<tool_call>\n<parameter=a>\n1\n</parameter>\n</tool_call>", "qwen3_xml")
    assert "<function=NAME>" in bad.error


def test_llama3_forms():
    (call,) = parse_tool_calls('{"name": "lookup", "parameters": {"word": "cat"}}<|eot_id|>', "llama3")
    assert (call.name, call.arguments, call.error) == ("lookup", {"word": "cat"}, None)
    text = '<|python_tag|>{"name": "lookup", "parameters": {"word": "a"}}; {"name": "lookup", "parameters": {}}'
    first, second = parse_tool_calls(text, "llama3")
    assert (first.arguments, second.arguments) == ({"word": "a"}, {})
    assert first.raw.startswith("<|python_tag|>") and second.raw == '{"name": "lookup", "parameters": {}}'
    (builtin,) = parse_tool_calls('<|python_tag|>brave_search.call(query="weather in Paris")<|eom_id|>', "llama3")
    assert (builtin.name, builtin.arguments, builtin.error) == ("brave_search", {"query": "weather in Paris"}, None)
    # answers are not calls: prose, and JSON without a name
    assert parse_tool_calls("12 times 34 is 408.<|eot_id|>", "llama3") == []
    assert parse_tool_calls('{"answer": 408}<|eot_id|>', "llama3") == []
    assert parse_tool_calls("{braces} in prose<|eot_id|>", "llama3") == []


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ('{"name": "lookup", "parameters": {"word": "cat"}<|eot_id|>', "not valid JSON"),
        ("<|python_tag|>print(1)<|eom_id|>", "after <|python_tag|>"),
        ("<|python_tag|>search.call(1, 2)", 'key="value" arguments only'),
        ('<|python_tag|>{"parameters": {}}', 'no "name"'),
    ],
)
def test_llama3_malformed_calls_are_errors(text, error):
    (call,) = parse_tool_calls(text, "llama3")
    assert call.error is not None and error in call.error


def test_mistral_forms():
    # v3 tokenizer (Mistral 7B v0.3, Nemo): the template renders one list, call ids of 9 characters
    text = (
        '[TOOL_CALLS] [{"name": "multiply", "arguments": {"a": 2, "b": 3}, "id": "abc123def"}, '
        '{"name": "lookup", "arguments": {"word": "x"}, "id": "xyz987uvw"}]</s>'
    )
    first, second = parse_tool_calls(text, "mistral")
    assert (first.name, first.arguments, first.id) == ("multiply", {"a": 2, "b": 3}, "abc123def")
    assert (second.name, second.arguments, second.id) == ("lookup", {"word": "x"}, "xyz987uvw")
    assert first.as_message_call()["id"] == "abc123def"
    # v11+ (Mistral Small 3.2, Magistral): one tag per call, name then [ARGS]
    text = '[TOOL_CALLS]multiply[ARGS]{"a": 2, "b": 3}[TOOL_CALLS]lookup[CALL_ID]c1[ARGS]{"word": "x"}</s>'
    first, second = parse_tool_calls(text, "mistral")
    assert (first.name, first.arguments, first.raw) == ("multiply", {"a": 2, "b": 3}, text[: text.index("}") + 1])
    assert (second.name, second.arguments, second.id) == ("lookup", {"word": "x"}, "c1")
    assert parse_tool_calls("It is 6.</s>", "mistral") == []
    (bad,) = parse_tool_calls('[TOOL_CALLS] [{"name": "multiply", "arguments": {"a": 2</s>', "mistral")
    assert "not valid JSON" in bad.error
    (bad,) = parse_tool_calls("[TOOL_CALLS]multiply[ARGS][1]", "mistral")
    assert "must be a JSON object" in bad.error


def test_validate_calls_reports_unknown_tools_and_bad_arguments():
    def call(name, arguments):
        return ToolCall(name, arguments, "", 0, 0)

    checked = validate_calls(
        [
            call("multiply", {"a": 1, "b": 2}),
            call("divide", {"a": 1}),
            call("multiply", {"a": 1}),
            call("multiply", {"a": 1, "b": "2"}),
            call("lookup", {"word": "x", "lang": "en"}),
            ToolCall(None, {}, "<tool_call>{", 0, 12, error="the tool call is not valid JSON"),
        ],
        SCHEMAS,
    )
    assert [c.error for c in checked] == [
        None,
        "there is no tool named 'divide' (the tools are: 'multiply', 'lookup')",
        "wrong arguments for 'multiply': missing required argument 'b'",
        "wrong arguments for 'multiply': argument 'b' must be integer, got str '2'",
        "wrong arguments for 'lookup': unknown argument 'lang' (it takes 'word')",
        "the tool call is not valid JSON",
    ]


@pytest.fixture
def parsers_restored():
    """The tool-call parsers as before the test, afterwards."""
    before = dict(parsing.TOOL_PARSERS)
    yield
    parsing.TOOL_PARSERS.clear()
    parsing.TOOL_PARSERS.update(before)


@pytest.mark.usefixtures("parsers_restored")
def test_registry():

    def parse_bang(text: str) -> list[ToolCall]:
        return [ToolCall(text[1:], {}, text, 0, len(text))] if text.startswith("!") else []

    register_tool_parser("bang", parse_bang, lambda template: "<bang>" in template)
    assert get_tool_parser("bang") is parse_bang
    assert tool_parser_for("<bang> and <tool_call>") == "bang"  # registered ones are tried first
    assert [c.name for c in parse_tool_calls("!lookup", "bang")] == ["lookup"]
    assert parse_tool_calls("!x", parse_bang)[0].name == "x"
    with pytest.raises(ToolError, match="registered already; pass overwrite=True"):
        register_tool_parser("bang", parse_bang)
    register_tool_parser("bang", parse_bang, overwrite=True)
    with pytest.raises(ToolError, match=r"unknown tool-call parser 'nope'; known: .*hermes.*bang"):
        get_tool_parser("nope")
    with pytest.raises(ToolError, match="must be a function"):
        register_tool_parser("broken", "not a function")
