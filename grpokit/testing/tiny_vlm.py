"""A tiny random-init Qwen2-VL (real transformers classes) with a word tokenizer that carries Qwen2-VL's image tokens
and a chat template placing them, built locally without a hub and without torchvision."""

from __future__ import annotations

from pathlib import Path

import torch

from grpokit.testing import build_word_tokenizer

IMAGE_TOKENS = ["<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]

# Qwen2-VL's template in the word tokenizer's form (tokens separated by spaces): each {"type": "image"} entry becomes
# <|vision_start|><|image_pad|><|vision_end|>, which the processor widens to the image's number of patches.
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|> {{ m['role'] }} "
    "{% if m['content'] is string %}{{ m['content'] }} {% else %}{% for c in m['content'] %}"
    "{% if c['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|> "
    "{% elif c['type'] == 'text' %}{{ c['text'] }} {% endif %}{% endfor %}{% endif %}<|im_end|> {% endfor %}"
    "{% if add_generation_prompt %}<|im_start|> assistant {% endif %}"
)


def build_vlm_tokenizer(words: list[str]):
    """A word tokenizer over ``words`` with Qwen2-VL's special tokens and :data:`CHAT_TEMPLATE`."""
    tokenizer = build_word_tokenizer(words)
    tokenizer.add_special_tokens({"additional_special_tokens": IMAGE_TOKENS})
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def build_tiny_qwen2_vl(
    path: str | Path | None = None,
    words: list[str] | None = None,
    hidden_size: int = 32,
    num_layers: int = 2,
    image_side: int = 28,
    seed: int = 0,
):
    """(model, tokenizer, image processor): a ``Qwen2VLForConditionalGeneration`` (vision depth 1, ``num_layers`` text
    layers, width ``hidden_size``), its tokenizer and the PIL image processor (torchvision-free; the processor is
    :func:`grpokit.models.vision.make_processor` of these two, or ``load_processor`` of the saved folder). Images are
    resized to ``image_side`` pixels square (28: 4 patches of 14, one merged image token). Saved to ``path`` (model,
    tokenizer with the template, image processor) when given, so ``from_pretrained`` loads it as a hub folder would.
    """
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    tokenizer = build_vlm_tokenizer(words or [f"w{i}" for i in range(40)])
    pixels = image_side * image_side
    images = Qwen2VLImageProcessorPil(
        min_pixels=pixels, max_pixels=pixels, patch_size=14, merge_size=2, temporal_patch_size=2
    )
    ids = {name: tokenizer.convert_tokens_to_ids(f"<|{name}|>") for name in ("image_pad", "video_pad")}
    special = dict(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id
    )
    heads = 2
    config = Qwen2VLConfig(
        text_config=dict(
            vocab_size=len(tokenizer),
            hidden_size=hidden_size,
            num_hidden_layers=num_layers,
            num_attention_heads=heads,
            num_key_value_heads=heads,
            intermediate_size=2 * hidden_size,
            max_position_embeddings=512,
            rope_scaling={"type": "mrope", "mrope_section": _mrope_section(hidden_size // heads)},
            tie_word_embeddings=True,
            **special,
        ),
        vision_config=dict(
            depth=1,
            embed_dim=32,
            hidden_size=hidden_size,
            num_heads=2,
            mlp_ratio=2,
            patch_size=14,
            spatial_merge_size=2,
            temporal_patch_size=2,
            in_chans=3,
        ),
        image_token_id=ids["image_pad"],
        video_token_id=ids["video_pad"],
        vision_start_token_id=tokenizer.convert_tokens_to_ids("<|vision_start|>"),
        vision_end_token_id=tokenizer.convert_tokens_to_ids("<|vision_end|>"),
        tie_word_embeddings=True,
        **special,
    )
    torch.manual_seed(seed)
    model = Qwen2VLForConditionalGeneration(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    if path is not None:
        model.save_pretrained(path)
        tokenizer.save_pretrained(path)
        images.save_pretrained(path)
    return model, tokenizer, images


def _mrope_section(head_dim: int) -> list[int]:
    """Qwen2-VL's split of a head's rotary half (temporal, height, width), scaled down from 16/24/24 of 64."""
    half = head_dim // 2
    t = max(half // 4, 1)
    h = (half - t) // 2
    return [t, h, half - t - h]
