"""A tokenizer with a tool-calling chat template, built locally, for tests and benchmarks of multi-turn rollouts.

The tokenizer is byte-level without merges: every byte is one token, so any text round-trips and a
span of token ids decodes to exactly the text it came from (what a loss-mask test needs), and the
model's text tokenizes the same alone or inside the conversation.
"""

from __future__ import annotations

from typing import Any

# The Qwen2.5 format: tools in the system turn, calls in <tool_call> blocks, results as <tool_response>
# blocks in a user turn (consecutive tool messages share one).
QWEN_STYLE_TEMPLATE = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0].role == 'system' %}{{- messages[0].content }}"
    "{%- else %}{{- 'You are a helpful assistant.' }}{%- endif %}"
    "{{- '\\n\\n# Tools\\n\\nYou may call functions. Their signatures are within <tools></tools> tags:\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nFor each call, write a JSON object with the name and arguments within <tool_call>"
    '</tool_call> tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n'
    "</tool_call><|im_end|>\\n' }}"
    "{%- elif messages[0].role == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'user' or (message.role == 'assistant' and not message.tool_calls) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- elif message.role == 'assistant' %}"
    "{{- '<|im_start|>assistant' }}"
    "{%- if message.content %}{{- '\\n' + message.content }}{%- endif %}"
    "{%- for call in message.tool_calls %}"
    "{%- set call = call.function if call.function is defined else call %}"
    '{{- \'\\n<tool_call>\\n{\\"name\\": \\"\' + call.name + \'\\", \\"arguments\\": \' }}'
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


def byte_tokenizer(special: list[str], added: list[str], eos: str, bos: str | None = None) -> Any:
    """A byte-level ``PreTrainedTokenizerFast`` without merges, plus ``special`` tokens (``eos``,
    ``bos`` too) and ``added`` ordinary tokens (as ``<tool_call>`` is in Qwen2.5's vocabulary)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    core = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core, eos_token=eos, bos_token=bos, additional_special_tokens=special
    )
    tokenizer.add_tokens(added)
    return tokenizer


def qwen_style_tokenizer() -> Any:
    """:func:`byte_tokenizer` with Qwen2.5's chat tokens and :data:`QWEN_STYLE_TEMPLATE`; pad is ``<|endoftext|>``."""
    tokenizer = byte_tokenizer(["<|im_start|>", "<|endoftext|>"], ["<tool_call>", "</tool_call>"], "<|im_end|>")
    tokenizer.pad_token = "<|endoftext|>"
    tokenizer.chat_template = QWEN_STYLE_TEMPLATE
    return tokenizer
