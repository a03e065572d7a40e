"""The token ids of a multi-turn conversation, and the loss mask over what the model wrote.

A rollout with tools is one token sequence built turn by turn: the prompt (rendered by the chat
template, with the tools' schemas), then the tokens the model generates, then the tokens the
environment adds after each turn with tool calls (the end of the turn if the model did not write
it, the tool messages, the header of the next assistant turn), then the model's next turn, and so
on. The model's own tokens are never re-tokenized: what it generated is kept as it was sampled, so
the log-probs of training are those of sampling. The loss mask is 1 exactly on generated tokens.

:func:`tool_suffix_ids` gives the environment's tokens of one step, which a rollout engine appends
to the sequence (and its KV cache) and decodes on from. They come from rendering a short dummy
conversation with and without the tool messages and keeping the difference (TRL's
``_get_tool_suffix_ids``), cut after the assistant turn's closing token. That needs a chat template that
renders what comes before the assistant turn the same whatever follows, which is checked; the turn itself may
render differently (Qwen3's own template drops its empty reasoning block once tool messages follow, where TRL
swaps in a training template), since the model's sampled tokens are kept, never re-rendered.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from grpokit.tools.json_schema import ToolError

_SENTINEL = "grpokit-end-of-turn-probe"


def render_ids(
    tokenizer: Any,
    messages: Sequence[Mapping[str, Any]],
    *,
    tools: Sequence[Mapping[str, Any]] | None = None,
    add_generation_prompt: bool = False,
    chat_template: str | None = None,
    **template_kwargs: Any,
) -> list[int]:
    """The token ids of ``messages`` rendered by the chat template (``tools``: schemas for the
    prompt; an empty list is passed as None, since some templates render tool boilerplate for [])."""
    ids = tokenizer.apply_chat_template(
        [dict(m) for m in messages],
        tools=list(tools) if tools else None,
        add_generation_prompt=add_generation_prompt,
        chat_template=chat_template,
        tokenize=True,
        return_dict=False,
        **template_kwargs,
    )
    return [int(i) for i in ids]


def _special_ids(tokenizer: Any) -> set[int]:
    decoder = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    return set(tokenizer.all_special_ids) | {i for i, token in decoder.items() if getattr(token, "special", False)}


def end_of_turn_id(tokenizer: Any, chat_template: str | None = None, **template_kwargs: Any) -> int:
    """The token that closes an assistant turn: the first special token the template writes after an
    assistant message's text (``<|im_end|>`` for Qwen, ``<|eot_id|>`` for Llama 3, ``</s>`` for Mistral)."""
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": _SENTINEL}]
    text = tokenizer.apply_chat_template(messages, chat_template=chat_template, tokenize=False, **template_kwargs)
    tail = text[text.index(_SENTINEL) + len(_SENTINEL) :] if _SENTINEL in text else ""
    special = _special_ids(tokenizer)
    for token in tokenizer.encode(tail, add_special_tokens=False):
        if token in special:
            return int(token)
    if tokenizer.eos_token_id is None:
        raise ToolError(
            "cannot tell which token ends an assistant turn: the chat template writes no special token after "
            "the assistant's text and the tokenizer has no eos_token"
        )
    return int(tokenizer.eos_token_id)


def tool_suffix_ids(
    tokenizer: Any,
    tool_messages: Sequence[Mapping[str, Any]],
    *,
    turn_ended: bool = True,
    chat_template: str | None = None,
    end_of_turn: int | None = None,
    processor: Any = None,
    **template_kwargs: Any,
) -> list[int]:
    """The tokens to append after the model's last token of a turn with tool calls: the end of the
    turn (only when ``turn_ended`` is False, i.e. the model stopped without writing its end-of-turn
    token), what the template writes between turns, the ``tool_messages`` (``{"role": "tool",
    "name": ..., "content": ...}``), and the next assistant turn's header. ``end_of_turn``: the token
    id from :func:`end_of_turn_id` (found when not given). Tool messages with images (content parts
    ``{"type": "image", "image": <PIL image>}``) need the model's ``processor``: use :func:`tool_suffix_inputs`."""
    return tool_suffix_inputs(
        tokenizer,
        tool_messages,
        turn_ended=turn_ended,
        chat_template=chat_template,
        end_of_turn=end_of_turn,
        processor=processor,
        **template_kwargs,
    )[0]


def message_images(messages: Sequence[Mapping[str, Any]]) -> list:
    """The PIL images of ``messages``' content parts (``{"type": "image", "image": ...}``), in order."""
    return [
        part["image"]
        for m in messages
        if isinstance(m.get("content"), list)
        for part in m["content"]
        if isinstance(part, Mapping) and part.get("type") == "image" and part.get("image") is not None
    ]


def _render_with_images(tokenizer: Any, processor: Any, messages, images: list, render: dict) -> tuple[list, dict]:
    """(token ids, pixel inputs) of ``messages`` rendered by the chat template and encoded by ``processor``, which
    widens each image's placeholder to the image's patches (as transformers' processor.apply_chat_template does)."""
    text = tokenizer.apply_chat_template(
        [dict(m) for m in messages], add_generation_prompt=True, tokenize=False, **render
    )
    encoded = dict(processor(text=[text], images=images, return_tensors="pt", add_special_tokens=False))
    ids = [int(i) for i in encoded.pop("input_ids")[0].tolist()]
    pixels = {
        k: v
        for k, v in encoded.items()
        if hasattr(v, "dim") and k != "attention_mask" and not (k.endswith("type_ids") and v.dim() == 2)
    }
    return ids, pixels


def tool_suffix_inputs(
    tokenizer: Any,
    tool_messages: Sequence[Mapping[str, Any]],
    *,
    turn_ended: bool = True,
    chat_template: str | None = None,
    end_of_turn: int | None = None,
    processor: Any = None,
    **template_kwargs: Any,
) -> tuple[list[int], dict | None]:
    """:func:`tool_suffix_ids` and the processor's pixel inputs of the tool messages' images (``pixel_values``,
    ``image_grid_thw`` ...; None when they hold none). Their placeholders in the ids are widened to each image's
    patches by ``processor`` (a ToolError without one)."""
    if not tool_messages:
        raise ToolError("tool_suffix_ids needs at least one tool message")
    if end_of_turn is None:
        end_of_turn = end_of_turn_id(tokenizer, chat_template, **template_kwargs)
    first = tool_messages[0]
    # One dummy call, as TRL renders it; an id for templates that require one (Mistral: 9 characters)
    call: dict[str, Any] = {"type": "function", "function": {"name": first.get("name", "tool"), "arguments": {}}}
    call["id"] = first.get("tool_call_id", "call00000")
    dummy = [{"role": "user", "content": "dummy"}, {"role": "assistant", "content": "", "tool_calls": [call]}]
    render = dict(chat_template=chat_template, **template_kwargs)
    prefix = render_ids(tokenizer, dummy, **render)
    images, pixels = message_images(tool_messages), None
    if images and processor is None:
        raise ToolError("tool messages with images need the model's processor to encode them")
    if images:
        full, pixels = _render_with_images(tokenizer, processor, [*dummy, *tool_messages], images, render)
    else:
        full = render_ids(tokenizer, [*dummy, *tool_messages], add_generation_prompt=True, **render)
    ends = [i for i, token in enumerate(prefix) if token == end_of_turn]
    if not ends:
        raise ToolError(
            f"the chat template does not close an assistant turn with tool calls with the end-of-turn token "
            f"{tokenizer.convert_ids_to_tokens(end_of_turn)!r}; pass end_of_turn= the token it uses"
        )
    closing = ends[-1]  # the assistant turn's closing token in ``prefix``
    if full[: closing + 1] != prefix[: closing + 1]:
        closing = _closing_after_rerender(tokenizer, dummy, prefix, full, ends, end_of_turn, render)
    return (full[closing + 1 :] if turn_ended else full[closing:]), pixels


def _closing_after_rerender(tokenizer, dummy, prefix, full, ends, end_of_turn, render) -> int:
    """The index in ``full`` of the assistant turn's closing token when the template renders that turn differently
    once tool messages follow it (Qwen3's drops the empty reasoning block of a turn that is not the last). The
    model's turn is never re-rendered (its sampled tokens are kept), so only what follows the turn matters; that is
    well defined when everything before the turn renders the same and the turn closes with one end-of-turn token."""
    head = render_ids(tokenizer, dummy[:1], add_generation_prompt=True, **render)  # the user's turn and a header
    start = _common_length(head, prefix)  # where the assistant turn's own tokens begin, at the latest
    later = [i for i in range(start, len(full)) if full[i] == end_of_turn]
    if _common_length(prefix, full) < start or any(start <= i < ends[-1] for i in ends) or not later:
        raise ToolError(
            "the chat template renders the turns before an assistant turn differently once tool messages follow "
            "it (it is not prefix-preserving), so the tokens between the model's turns cannot be told apart; use a "
            "prefix-preserving template for training (chat_template=..., such as the *_training.jinja templates "
            "TRL ships)"
        )
    return later[0]


def _common_length(a: Sequence[int], b: Sequence[int]) -> int:
    """The length of the longest common prefix of ``a`` and ``b``."""
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


@dataclass
class TokenConversation:
    """A conversation as token ids, built turn by turn: ``ids``, ``mask`` (1 on the tokens the model
    generated, 0 on the prompt and on what the environment added) and ``prompt_length``."""

    ids: list[int]
    mask: list[int]
    prompt_length: int
    spans: list[tuple[int, int]] = field(default_factory=list)  # [start, end) of each generated turn
    # tool-returned images after the prompt, in order: the processor's inputs of each round's images (a dict of
    # tensors whose first dimension runs over that round's images or patches) and the PIL images themselves
    pixels: list[dict] = field(default_factory=list)
    images: list = field(default_factory=list)

    @classmethod
    def from_prompt(cls, prompt_ids: Sequence[int]) -> TokenConversation:
        ids = [int(i) for i in prompt_ids]
        return cls(ids, [0] * len(ids), len(ids))

    def add_generated(self, token_ids: Sequence[int]) -> None:
        """The model's tokens of one turn (as sampled, end-of-turn token included when it wrote one)."""
        self.spans.append((len(self.ids), len(self.ids) + len(token_ids)))
        self.ids.extend(int(i) for i in token_ids)
        self.mask.extend([1] * len(token_ids))

    def add_environment(self, token_ids: Sequence[int], pixels: dict | None = None, images: Sequence = ()) -> None:
        """Tokens the model did not write (a tool suffix): in the sequence, out of the loss; ``pixels``: the
        processor's inputs of the ``images`` they show (their placeholders widened in ``token_ids``)."""
        self.ids.extend(int(i) for i in token_ids)
        self.mask.extend([0] * len(token_ids))
        if pixels is not None:
            self.pixels.append(pixels)
            self.images.extend(images)

    @property
    def completion_ids(self) -> list[int]:
        return self.ids[self.prompt_length :]

    @property
    def completion_mask(self) -> list[int]:
        return self.mask[self.prompt_length :]


class ConversationTokens:
    """One tokenizer's chat template bound for a rollout loop: :meth:`start` a conversation from the
    prompt messages, :meth:`add_tool_results` after each turn with tool calls (returns the suffix to
    append to the KV cache). Pure apart from the end-of-turn token it looks up once."""

    def __init__(self, tokenizer: Any, chat_template: str | None = None, processor: Any = None, **template_kwargs: Any):
        self.tokenizer, self.processor = tokenizer, processor
        self.chat_template = chat_template
        self.template_kwargs = template_kwargs
        self.end_of_turn = end_of_turn_id(tokenizer, chat_template, **template_kwargs)

    def start(
        self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None = None
    ) -> TokenConversation:
        """The prompt with the tools' schemas and the first assistant header; nothing generated yet."""
        ids = render_ids(
            self.tokenizer,
            messages,
            tools=tools,
            add_generation_prompt=True,
            chat_template=self.chat_template,
            **self.template_kwargs,
        )
        return TokenConversation.from_prompt(ids)

    def tool_suffix(self, conversation: TokenConversation, tool_messages: Sequence[Mapping[str, Any]]) -> list[int]:
        """The tokens that would follow ``conversation``'s last generated turn with ``tool_messages``
        (the end-of-turn token first when the model stopped without it); the conversation is unchanged."""
        return self.tool_suffix_inputs(conversation, tool_messages)[0]

    def tool_suffix_inputs(
        self, conversation: TokenConversation, tool_messages: Sequence[Mapping[str, Any]]
    ) -> tuple[list[int], dict | None]:
        """:meth:`tool_suffix` and the pixel inputs of the tool messages' images (None: no image), encoded by the
        processor (:func:`tool_suffix_inputs`)."""
        if not conversation.spans:
            raise ToolError("tool results follow a turn the model generated; this conversation has none yet")
        return tool_suffix_inputs(
            self.tokenizer,
            tool_messages,
            turn_ended=conversation.ids[-1] == self.end_of_turn,
            chat_template=self.chat_template,
            end_of_turn=self.end_of_turn,
            processor=self.processor,
            **self.template_kwargs,
        )

    def add_tool_results(
        self, conversation: TokenConversation, tool_messages: Sequence[Mapping[str, Any]]
    ) -> list[int]:
        """Append :meth:`tool_suffix` to ``conversation`` (mask 0) and return it: the tokens a rollout
        engine feeds to its kept KV cache before decoding the next turn."""
        suffix, pixels = self.tool_suffix_inputs(conversation, tool_messages)
        conversation.add_environment(suffix, pixels, message_images(tool_messages))
        return suffix
