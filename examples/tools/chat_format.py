"""The tokenizer and chat template of examples/tools: character-level, with Qwen2.5's tool-call format.

A conversation renders as Qwen2.5 renders it (``<|im_start|>role\\n...<|im_end|>``, calls as hermes
``<tool_call>{json}</tool_call>`` blocks, results in ``<tool_response>`` blocks of a user turn), so
grpokit's ``hermes`` parser reads the calls and the template is prefix-preserving, as multi-turn training
needs. Two things are cut down for a tiny model on a CPU, where every token costs on every step:

- the system turn names the tools (``Tools: calculator``) instead of printing their JSON schemas;
- the tokenizer is character-level (the demo's, :func:`grpokit.data.char_tokenizer.build_char_tokenizer`)
  plus whole tokens for the chat markup, the role names and the fixed words of a call (``"name"``,
  ``"arguments"``, ``"calculator"``, ``"expression"``), as a subword vocabulary would have them. A call is
  then 27 tokens instead of 85, and digits stay one token each.
"""

from __future__ import annotations

import string

from grpokit.data.char_tokenizer import build_char_tokenizer

SPECIAL = ["<|im_start|>", "<|im_end|>"]
WORDS = [
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
    "system",
    "user",
    "assistant",
    '"name"',
    '"arguments"',
    '"calculator"',
    '"expression"',
]
ALPHABET = string.digits + string.ascii_letters + string.punctuation + " \n"

TEMPLATE = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\nTools: ' }}"
    "{%- for tool in tools %}{{- (', ' if not loop.first else '') + (tool.function or tool).name }}{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'user' or (message.role == 'assistant' and not message.tool_calls) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- elif message.role == 'assistant' %}"
    "{{- '<|im_start|>assistant\\n' + (message.content or '') }}"
    "{%- for call in message.tool_calls %}"
    "{%- set call = call.function if call.function is defined else call %}"
    '{{- \'<tool_call>\\n{"name": "\' + call.name + \'", "arguments": \' }}'
    "{{- call.arguments | tojson }}{{- '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def tool_tokenizer():
    """The character-level tokenizer with the chat tokens and :data:`TEMPLATE`; ``<|im_end|>`` ends a turn
    and is the EOS token, ``<pad>`` pads."""
    tokenizer = build_char_tokenizer(ALPHABET, add_bos=False)
    tokenizer.add_special_tokens({"additional_special_tokens": SPECIAL})
    tokenizer.add_tokens(WORDS)
    tokenizer.eos_token = "<|im_end|>"
    tokenizer.chat_template = TEMPLATE
    return tokenizer
