"""Byte-level BPE tokenizers for the VLM stand-ins of scripts/build_vlm_fixtures.py, trained here offline.

Each family's tokenizer is one small BPE trained on local text (there is no hub to download the real ones), laid
out as the real byte-level vocabularies are: the 256 byte symbols first, in GPT-2's ``bytes_to_unicode`` order (so
``"!"`` is id 0, ``"<"`` 27, ``"\\n"`` 198, as in Qwen's), then the trained merges, then the family's special tokens
(its image tokens included). ``special_offset`` places the special tokens at a fixed id (fillers pad the gap) and
``pinned`` places given pieces at given ids: TRL's ``test_train_with_tools_multimodal_response`` writes Qwen3.5's
real token ids into its fake ``generate``, and they must decode to the text it means.
"""

from __future__ import annotations

import codecs
import contextlib
import inspect
import io

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

# Qwen2's pre-tokenizer split (regex + byte-level), as the text stand-ins of the suite use
SPLIT = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"""
    r"""\s*[\r\n]+|\s+(?!\S)|\s+"""
)


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character map, in its order (printable bytes first, the rest from U+0100)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    chars = list(printable)
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return dict(zip(printable, (chr(c) for c in chars), strict=True))


def corpus() -> list[str]:
    """Local training text: the Zen of Python, some stdlib source and the prompts of TRL's zen datasets."""
    with contextlib.redirect_stdout(io.StringIO()):  # importing `this` prints the Zen of Python
        import this
    zen = codecs.decode(this.s, "rot13")
    import argparse
    import dataclasses
    import json
    import textwrap

    texts = [zen] * 20 + [inspect.getsource(m) for m in (json, textwrap, argparse, dataclasses)]
    texts += [
        "The quick brown fox jumps over the lazy dog. 0123456789 " * 5,
        "What is better than ugly? Beautiful is better than ugly. Describe the image. I don't know any tool. Done!",
        "<tool_call>\n<function=screenshot_tool>\n</function>\n</tool_call> Here is the screenshot " * 3,
    ]
    return texts


def _trained(vocab_size: int) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(SPLIT), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tok.train_from_iterator(corpus(), trainer=trainer)
    return tok


def _layout(trained: Tokenizer, pinned: dict[str, int], offset: int | None) -> tuple[dict[str, int], list]:
    """(vocab, merges): bytes at 0..255 in GPT-2 order, pinned pieces at their ids, trained pieces in the gaps."""
    import json

    model = json.loads(trained.to_str())["model"]
    vocab: dict[str, int] = {ch: i for i, ch in enumerate(bytes_to_unicode().values())}
    vocab.update(pinned)
    taken = set(vocab.values())
    next_id = 0
    for piece, _ in sorted(model["vocab"].items(), key=lambda kv: kv[1]):
        if piece in vocab:
            continue
        while next_id in taken:
            next_id += 1
        vocab[piece] = next_id
        taken.add(next_id)
    end = max(offset or 0, max(taken) + 1)
    if offset is not None and offset < max(taken) + 1:
        raise ValueError(f"special_offset {offset} is below the {max(taken) + 1} ids of the trained vocabulary")
    for i in range(end):  # unreachable fillers in the gaps (no merge makes them): ' <f1234>' when decoded
        if i not in taken:
            vocab[f"Ġ<f{i}>"] = i
    merges = [tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    return vocab, merges


def build_tokenizer(
    special: list[str],
    chat_template: str,
    *,
    bos: str | None,
    eos: str,
    pad: str | None,
    unk: str | None = None,
    nonspecial: tuple[str, ...] = (),
    add_bos: bool = False,
    extra_special_tokens: dict[str, str] | None = None,
    special_offset: int | None = None,
    pinned: dict[str, int] | None = None,
    vocab_size: int = 1200,
):
    """A PreTrainedTokenizerFast with the family's special tokens (in the given order) and chat template."""
    from transformers import PreTrainedTokenizerFast

    vocab, merges = _layout(_trained(vocab_size), pinned or {}, special_offset)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(SPLIT), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in special])
    if nonspecial:
        tok.add_tokens([AddedToken(s, special=False, normalized=False) for s in nonspecial])
    if add_bos:
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, tok.token_to_id(bos))]
        )
    else:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=bos,
        eos_token=eos,
        pad_token=pad,
        unk_token=unk,
        model_max_length=131072,
        clean_up_tokenization_spaces=False,
        extra_special_tokens=extra_special_tokens or {},
    )
    fast.chat_template = chat_template
    return fast
