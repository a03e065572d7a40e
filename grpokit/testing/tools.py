"""A tokenizer with a tool-calling chat template, and a tiny model that follows a script of chat turns, built
locally, for tests, examples and benchmarks of multi-turn rollouts.

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


def scripted_chat_lm(tokenizer: Any, turns: list[str], strength: float = 30.0, hidden: int = 8, seed: int = 0):
    """A trainable custom module (``forward(input_ids) -> logits``) that writes ``turns[k]`` as its k-th assistant
    turn after the prompt (the last one again past the end): a bias of ``strength`` on each scripted token, on top
    of a small learned bigram model (embedding -> linear, so training has gradients). A ``#`` in a turn is a free
    digit: every digit gets the bias and the learned part chooses, so rollouts differ there. A turn is found
    by the ``<|im_start|>assistant\\n`` headers before a position: the logits depend on earlier tokens only,
    as a causal model's do, and sampling and training see the same distribution."""
    import torch

    class _Scripted(torch.nn.Module):
        def __init__(self):
            super().__init__()
            generator = torch.Generator().manual_seed(seed)
            vocab = len(tokenizer)
            self.embed = torch.nn.Embedding(vocab, hidden)
            self.head = torch.nn.Linear(hidden, vocab)
            with torch.no_grad():
                self.embed.weight.copy_(torch.randn(vocab, hidden, generator=generator))
                self.head.weight.copy_(torch.randn(vocab, hidden, generator=generator) / hidden**0.5)
                self.head.bias.zero_()
            header = tokenizer.encode("<|im_start|>assistant\n", add_special_tokens=False)
            end = tokenizer.convert_tokens_to_ids("<|im_end|>")
            scripts = []
            for turn in turns:  # "#" = -1, a free digit
                pieces = [tokenizer.encode(piece, add_special_tokens=False) for piece in turn.split("#")]
                scripts.append([t for piece in pieces for t in [*piece, -1]][:-1])
            width = max(len(s) for s in scripts) + 1
            table = torch.full((len(scripts), width), end, dtype=torch.long)  # past a turn's script: end of turn
            for k, script in enumerate(scripts):
                table[k, : len(script)] = torch.tensor(script)
            self.register_buffer("table", table, persistent=False)
            self.register_buffer("header", torch.tensor(header), persistent=False)
            digits = torch.zeros(vocab, dtype=torch.bool)
            digits[[tokenizer.encode(str(d), add_special_tokens=False)[0] for d in range(10)]] = True
            self.register_buffer("digits", digits, persistent=False)

        def forward(self, input_ids):
            N, L = input_ids.shape
            logits = self.head(self.embed(input_ids))  # [N, L, V]
            h = self.header.numel()
            if L < h:
                return logits
            starts = (input_ids.unfold(1, h, 1) == self.header).all(-1)  # [N, L-h+1]: a header starts here
            ends = torch.zeros((N, L), dtype=torch.bool, device=input_ids.device)
            ends[:, h - 1 :] = starts  # [N, L]: a header ends here
            count = ends.long().cumsum(1)  # [N, L] headers up to each position
            position = torch.arange(L, device=input_ids.device).expand(N, L)
            last = torch.where(ends, position, -1).cummax(1).values  # [N, L] the last header's end
            turn = (count - 1).clamp(0, self.table.size(0) - 1)
            offset = (position - last).clamp(max=self.table.size(1) - 1)
            target = self.table[turn, offset]  # [N, L] the token after each position (-1: a free digit)
            active = count > 0
            bias = torch.zeros_like(logits)
            scripted = active & (target >= 0)
            bias[scripted] = bias[scripted].scatter(-1, target[scripted][:, None], strength)
            free = active & (target < 0)
            bias[free] = self.digits.to(logits.dtype) * strength
            return logits + bias

    return _Scripted()
