"""Conversation tokens and the loss mask of a multi-turn rollout, on a byte-level tokenizer (every
character one token, so spans decode exactly) with a Qwen2.5-style chat template with tools, and on
TRL's shipped templates."""

from __future__ import annotations

import pytest

from grpokit.testing.tools import QWEN_STYLE_TEMPLATE, byte_tokenizer, qwen_style_tokenizer
from grpokit.tools.conversation import (
    ConversationTokens,
    TokenConversation,
    end_of_turn_id,
    render_ids,
    tool_suffix_ids,
)
from grpokit.tools.json_schema import ToolError, tool_schemas


@pytest.fixture(scope="module")
def qwen_tokenizer():
    return qwen_style_tokenizer()


def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: The first factor.
        b: The second factor.
    """
    return a * b


TOOLS = tool_schemas([multiply])
PROMPT = [{"role": "user", "content": "What is 12 times 34?"}]
CALL = '<tool_call>\n{"name": "multiply", "arguments": {"a": 12, "b": 34}}\n</tool_call>'
CALL_MESSAGE = {
    "role": "assistant",
    "content": "",
    "tool_calls": [{"type": "function", "function": {"name": "multiply", "arguments": {"a": 12, "b": 34}}}],
}
RESULT = {"role": "tool", "name": "multiply", "content": "408"}


def runs(conversation: TokenConversation, value: int) -> list[tuple[int, int]]:
    """The [start, end) runs of the completion where the mask is ``value``."""
    out, start = [], None
    mask = conversation.mask
    for i in range(conversation.prompt_length, len(mask) + 1):
        inside = i < len(mask) and mask[i] == value
        if inside and start is None:
            start = i
        if not inside and start is not None:
            out.append((start, i))
            start = None
    return out


def encode(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


def test_end_of_turn_token(qwen_tokenizer):
    assert qwen_tokenizer.convert_ids_to_tokens(end_of_turn_id(qwen_tokenizer)) == "<|im_end|>"


@pytest.mark.parametrize("turn_ended", [True, False])
def test_mask_is_one_exactly_on_generated_tokens(qwen_tokenizer, turn_ended):
    tok = qwen_tokenizer
    chat = ConversationTokens(tok)
    conversation = chat.start(PROMPT, TOOLS)
    assert conversation.ids == render_ids(tok, PROMPT, tools=TOOLS, add_generation_prompt=True)
    assert tok.decode(conversation.ids).endswith("What is 12 times 34?<|im_end|>\n<|im_start|>assistant\n")
    # turn 1: the model writes a call and (or not: stopped by a stop string) its end-of-turn token
    first = CALL + ("<|im_end|>" if turn_ended else "")
    conversation.add_generated(encode(tok, first))
    suffix = chat.add_tool_results(conversation, [RESULT])
    assert tok.decode(suffix) == ("" if turn_ended else "<|im_end|>") + (
        "\n<|im_start|>user\n<tool_response>\n408\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )
    # turn 2: the answer
    second = "12 times 34 is 408.<|im_end|>"
    conversation.add_generated(encode(tok, second))

    # the whole sequence is the conversation as the template renders it (but the newline after the last turn)
    answer = {"role": "assistant", "content": "12 times 34 is 408."}
    full = render_ids(tok, [*PROMPT, CALL_MESSAGE, RESULT, answer], tools=TOOLS)
    assert conversation.ids == full[: len(conversation.ids)]
    assert tok.decode(full[len(conversation.ids) :]) == "\n"

    # mask: 1 on what the model wrote, token for token; 0 on the prompt and on the environment's tokens
    assert conversation.mask[: conversation.prompt_length] == [0] * conversation.prompt_length
    assert [tok.decode(conversation.ids[a:b]) for a, b in runs(conversation, 1)] == [first, second]
    assert runs(conversation, 1) == conversation.spans
    assert [tok.decode(conversation.ids[a:b]) for a, b in runs(conversation, 0)] == [tok.decode(suffix)]
    assert sum(conversation.mask) == len(encode(tok, first)) + len(encode(tok, second))
    assert conversation.completion_ids == conversation.ids[conversation.prompt_length :]
    assert len(conversation.completion_mask) == len(conversation.completion_ids)


def test_several_tool_results_share_one_turn(qwen_tokenizer):
    tok = qwen_tokenizer
    results = [RESULT, {"role": "tool", "name": "multiply", "content": "-1"}]
    suffix = tool_suffix_ids(tok, results)
    assert tok.decode(suffix) == (
        "\n<|im_start|>user\n<tool_response>\n408\n</tool_response>\n<tool_response>\n-1\n</tool_response>"
        "<|im_end|>\n<|im_start|>assistant\n"
    )


def test_conversation_errors(qwen_tokenizer):
    chat = ConversationTokens(qwen_tokenizer)
    with pytest.raises(ToolError, match="has none yet"):
        chat.add_tool_results(chat.start(PROMPT, TOOLS), [RESULT])
    with pytest.raises(ToolError, match="at least one tool message"):
        tool_suffix_ids(qwen_tokenizer, [])
    # a template that renders the user's turn differently once tool messages follow: the turns cannot be told apart
    unstable = QWEN_STYLE_TEMPLATE.replace(
        "{%- for message in messages %}",
        "{%- for message in messages %}{%- if message.role == 'user' and messages[-1].role == 'tool' %}~{%- endif %}",
    )
    with pytest.raises(ToolError, match="not prefix-preserving"):
        tool_suffix_ids(qwen_tokenizer, [RESULT], chat_template=unstable)


def test_a_rerendered_assistant_turn_keeps_the_suffix(qwen_tokenizer):
    """A template that writes the last assistant turn differently from earlier ones (Qwen3 drops its empty reasoning
    block) changes nothing: the model's turn is kept as sampled, and the suffix is what follows the turn's end."""
    marked = QWEN_STYLE_TEMPLATE.replace(
        "{%- for call in message.tool_calls %}",
        "{%- if loop.last %}{{- ' (last)' }}{%- endif %}{%- for call in message.tool_calls %}",
    )
    assert tool_suffix_ids(qwen_tokenizer, [RESULT], chat_template=marked) == tool_suffix_ids(qwen_tokenizer, [RESULT])
    # the model stopped without its end-of-turn token: the suffix starts with it
    unended = tool_suffix_ids(qwen_tokenizer, [RESULT], chat_template=marked, turn_ended=False)
    assert qwen_tokenizer.decode(unended[:1]) == "<|im_end|>"
    assert unended[1:] == tool_suffix_ids(qwen_tokenizer, [RESULT])


@pytest.mark.parametrize("name", ["qwen2_5", "qwen3_training", "llama3_1", "llama3_2"])
def test_real_chat_templates(name):
    """TRL's shipped templates: the suffix sits between the model's turns, the whole equals the render."""
    from importlib import resources

    pytest.importorskip("trl", reason="the chat templates come from TRL (the bench extra)")
    template = (resources.files("trl") / "chat_templates" / f"{name}.jinja").read_text()
    if name.startswith("llama"):
        special = ["<|start_header_id|>", "<|end_header_id|>", "<|eom_id|>", "<|python_tag|>"]
        tok = byte_tokenizer(special, [], "<|eot_id|>", bos="<|begin_of_text|>")
        call, end = '{"name": "multiply", "parameters": {"a": 12, "b": 34}}', "<|eot_id|>"
    else:
        tok = byte_tokenizer(["<|im_start|>", "<|endoftext|>"], ["<tool_call>", "</tool_call>"], "<|im_end|>")
        call, end = CALL, "<|im_end|>"
    tok.chat_template = template
    think = "<think>\n\n</think>\n\n" if name.startswith("qwen3") else ""  # Qwen3 writes an empty reasoning block
    turns = [think + call + end, think + "408" + end]
    chat = ConversationTokens(tok)
    assert tok.convert_ids_to_tokens(chat.end_of_turn) == end
    conversation = chat.start(PROMPT, TOOLS)
    conversation.add_generated(encode(tok, turns[0]))
    chat.add_tool_results(conversation, [RESULT])
    conversation.add_generated(encode(tok, turns[1]))
    full = render_ids(tok, [*PROMPT, CALL_MESSAGE, RESULT, {"role": "assistant", "content": "408"}], tools=TOOLS)
    assert conversation.ids == full[: len(conversation.ids)]
    assert [tok.decode(conversation.ids[a:b]) for a, b in conversation.spans] == turns


def test_qwen3_own_template_gives_the_training_templates_suffix():
    """Qwen3's own template drops the empty reasoning block of an assistant turn that tool messages follow (it is
    not prefix-preserving); the tokens between turns are those of TRL's qwen3_training.jinja all the same."""
    from importlib import resources

    pytest.importorskip("trl", reason="the chat templates come from TRL (the bench extra)")
    tok = byte_tokenizer(["<|im_start|>", "<|endoftext|>"], ["<tool_call>", "</tool_call>"], "<|im_end|>")
    templates = resources.files("trl") / "chat_templates"
    own, training = ((templates / f"{name}.jinja").read_text() for name in ("qwen3", "qwen3_training"))
    suffix = tool_suffix_ids(tok, [RESULT], chat_template=own)
    assert suffix == tool_suffix_ids(tok, [RESULT], chat_template=training)
    expected = "\n<|im_start|>user\n<tool_response>\n408\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    assert tok.decode(suffix) == expected
