"""The VLM families of TRL's ``TestGRPOTrainerVLM``: each builds (model, processor, generation config) offline.

TRL's recipe (``scripts/generate_tiny_models/for_conditional_generation/*.py`` in TRL's repository) loads the real
checkpoint's config and processor from the hub and overrides the sizes below. There is no hub here, so the config
is the transformers class's defaults (they describe the same checkpoints) with TRL's overrides, the processor is
the real processor class around the slow (PIL) image processor, and the tokenizer is trained locally with the
family's special tokens, image tokens and the exact chat template TRL ships (``trl/chat_templates``).

torchvision is not installed (PyPI's wheel does not load with the CPU torch): the image processors are the PIL
ones (``*ImageProcessorPil``, saved with ``image_processor_type`` naming them, so ``AutoProcessor`` loads them
without torchvision), and no video processor is saved (Qwen's and Gemma 4's are torchvision-only); the
processors accept ``video_processor=None`` and the tests send no video.
"""

from __future__ import annotations

from pathlib import Path

import trl
from vlm_fixture_tokenizers import build_tokenizer

TEMPLATES = Path(trl.__file__).parent / "chat_templates"
QWEN_SPECIAL = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>", "<|box_start|>",
    "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>",
    "<|image_pad|>", "<|video_pad|>",
]  # fmt: skip
QWEN_NONSPECIAL = (
    "<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
    "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>", "<think>", "</think>",
)  # fmt: skip
QWEN_VISION = {"image_token": "<|image_pad|>", "video_token": "<|video_pad|>", "vision_bos_token": "<|vision_start|>",
               "vision_eos_token": "<|vision_end|>"}  # fmt: skip
# Qwen3.5's real ids that TRL's test_train_with_tools_multimodal_response writes in its fake generate: its special
# tokens start at 248044 (<|endoftext|>; <tool_call> is 248058) and these byte-level pieces sit at their real ids
QWEN3_5_SPECIAL_OFFSET = 248044
QWEN3_5_PINNED = {"function": 1628, "=screen": 13744, "shot": 30091, "_tool": 22076, "</": 510, "Ġdon": 1459,
                  "'t": 914, "Ġknow": 1366, "Ġany": 866, "Ġtool": 5224, "Done": 16936}  # fmt: skip
SMALL_TEXT = {"num_hidden_layers": 2, "hidden_size": 16, "num_attention_heads": 4, "num_key_value_heads": 2}


def qwen_processor(processor_cls, image_processor, tok):
    """The family's processor, or where it cannot be built (it takes a video processor, and transformers has none
    without torchvision) PaddleOCRVLProcessor: transformers' image-only processor of the same form (an image
    processor and a tokenizer; each image becomes grid_t*grid_h*grid_w/merge_size**2 image tokens; it returns
    ``mm_token_type_ids``), which loads without torchvision."""
    import transformers as T

    try:
        return processor_cls(image_processor=image_processor, tokenizer=tok, chat_template=tok.chat_template)
    except (ImportError, AttributeError):  # AttributeError: transformers' dummy VIDEO_PROCESSOR_MAPPING
        return T.PaddleOCRVLProcessor(image_processor=image_processor, tokenizer=tok, chat_template=tok.chat_template)


def template(name: str) -> str:
    return (TEMPLATES / f"{name}.jinja").read_text(encoding="utf-8")


def ids(tok, *tokens: str) -> list[int]:
    return [tok.convert_tokens_to_ids(t) for t in tokens]


def qwen_tokenizer(chat_template: str, special_offset: int | None = None, pinned: dict | None = None):
    return build_tokenizer(
        QWEN_SPECIAL, chat_template, bos=None, eos="<|im_end|>", pad="<|endoftext|>", nonspecial=QWEN_NONSPECIAL,
        extra_special_tokens=QWEN_VISION, special_offset=special_offset, pinned=pinned,
    )  # fmt: skip


def qwen_token_ids(tok) -> dict:
    image, video, start, end = ids(tok, "<|image_pad|>", "<|video_pad|>", "<|vision_start|>", "<|vision_end|>")
    return {"image_token_id": image, "video_token_id": video, "vision_start_token_id": start,
            "vision_end_token_id": end}  # fmt: skip


def qwen_generation(tok, **sampling):
    from transformers import GenerationConfig

    eos = ids(tok, "<|im_end|>", "<|endoftext|>")
    return GenerationConfig(bos_token_id=eos[1], eos_token_id=eos, pad_token_id=eos[1], **sampling)


def qwen2_vl(kind: str):
    """Qwen2-VL-2B-Instruct / Qwen2.5-VL-3B-Instruct with TRL's sizes (mrope [1, 1] for head_dim 4)."""
    import transformers as T

    tok = qwen_tokenizer(template("qwen2_5_vl"))  # Qwen2-VL ships the same template as Qwen2.5-VL
    rope = {"rope_type": "default", "mrope_section": [1, 1], "rope_theta": 1000000.0}
    text = dict(SMALL_TEXT, vocab_size=len(tok), rope_parameters=rope, layer_types=None)
    text.update(bos_token_id=ids(tok, "<|endoftext|>")[0], eos_token_id=ids(tok, "<|im_end|>")[0])
    if kind == "2.5":
        vision = {"hidden_size": 16, "num_heads": 4, "depth": 2, "fullatt_block_indexes": [1], "out_hidden_size": 16}
        config = T.Qwen2_5_VLConfig(text_config=text, vision_config=vision, **qwen_token_ids(tok))
        model, processor_cls = T.Qwen2_5_VLForConditionalGeneration(config), T.Qwen2_5_VLProcessor
    else:
        vision = {"hidden_size": 16, "num_heads": 4, "embed_dim": 64, "depth": 2}
        config = T.Qwen2VLConfig(text_config=text, vision_config=vision, **qwen_token_ids(tok))
        model, processor_cls = T.Qwen2VLForConditionalGeneration(config), T.Qwen2VLProcessor
    image_processor = T.Qwen2VLImageProcessorPil(patch_size=14, merge_size=2, temporal_patch_size=2)
    processor = qwen_processor(processor_cls, image_processor, tok)
    gen = qwen_generation(tok, do_sample=True)  # the hub files' sampling values are not known here; TRL sets its own
    return model, processor, gen


def qwen3_5(kind: str):
    """Qwen3.5-0.8B (NoThink template, Qwen's real special-token ids) / Qwen3.6-35B-A3B (MoE) with TRL's sizes."""
    import transformers as T

    text = dict(SMALL_TEXT, layer_types=["linear_attention", "full_attention"], full_attention_interval=2)
    vision = {"hidden_size": 16, "depth": 2, "num_heads": 4, "intermediate_size": 32, "out_hidden_size": 16}
    if kind == "moe":
        tok = qwen_tokenizer(template("qwen3_6"))
        text.update(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=32)
        config_cls, model_cls = T.Qwen3_5MoeConfig, T.Qwen3_5MoeForConditionalGeneration
    else:
        tok = qwen_tokenizer(template("qwen3_5_nothink"), QWEN3_5_SPECIAL_OFFSET, QWEN3_5_PINNED)
        config_cls, model_cls = T.Qwen3_5Config, T.Qwen3_5ForConditionalGeneration
    vocab = 248320 if kind != "moe" else len(tok)  # Qwen3.5's real embedding rows where its real ids are used
    text.update(vocab_size=vocab, eos_token_id=ids(tok, "<|im_end|>")[0], pad_token_id=ids(tok, "<|endoftext|>")[0])
    config = config_cls(text_config=text, vision_config=vision, **qwen_token_ids(tok))
    model = model_cls(config)
    image_processor = T.Qwen2VLImageProcessorPil(patch_size=16, merge_size=2, temporal_patch_size=2)
    processor = qwen_processor(T.Qwen3VLProcessor, image_processor, tok)
    gen = None if kind != "moe" else qwen_generation(tok, do_sample=True)  # TRL saves none for Qwen3.5-NoThink
    return model, processor, gen


GEMMA3_IMAGE_SIZE, GEMMA3_IMAGE_TOKENS = 56, 16  # TRL's tiny checkpoint: 224 px, 256 tokens (see gemma3())
LLAVA_NEXT_IMAGE_SIZE = 28  # TRL's tiny checkpoint: CLIP at 336 px (see llava_next())


def gemma3():
    """gemma-3-4b-it with TRL's sizes but a smaller picture: SigLIP (patch 14) at 56 px, 16 image tokens, where
    TRL's tiny checkpoint keeps 224 px and 256 tokens (in both the projector's pooling is identity: one token a
    patch). 256 image tokens a prompt put TRL's own test_train_vlm over 600 s on the 2-core machine; the same code
    runs at 16 (SigLIP, the projector, token_type_ids and the bidirectional image mask). No SigLIP pooling head
    (gemma-3-4b's vision_use_head is false: the head would never get a gradient)."""
    import transformers as T

    special = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>", "<start_of_image>",
               "<end_of_image>", "<image_soft_token>"]  # fmt: skip
    image = {"image_token": "<image_soft_token>", "boi_token": "<start_of_image>", "eoi_token": "<end_of_image>"}
    tok = build_tokenizer(special, template("gemma3"), bos="<bos>", eos="<eos>", pad="<pad>", unk="<unk>",
                          add_bos=True, extra_special_tokens=image)  # fmt: skip
    pad, eos, bos, eot, boi, eoi, img = ids(tok, "<pad>", "<eos>", "<bos>", "<end_of_turn>", *image.values())[:7]
    text = dict(SMALL_TEXT, intermediate_size=32, layer_types=None, vocab_size=len(tok), pad_token_id=pad,
                eos_token_id=eos, bos_token_id=bos)  # fmt: skip
    vision = {"model_type": "siglip_vision_model", "num_hidden_layers": 2, "hidden_size": 16, "num_attention_heads": 4,
              "intermediate_size": 32, "image_size": GEMMA3_IMAGE_SIZE, "patch_size": 14,
              "vision_use_head": False}  # fmt: skip
    config = T.Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=GEMMA3_IMAGE_TOKENS,
                            boi_token_index=eoi, eoi_token_index=img, image_token_index=boi)  # fmt: skip
    config.boi_token_index, config.eoi_token_index, config.image_token_index = ids(
        tok, "<start_of_image>", "<end_of_image>", "<image_soft_token>"
    )
    image_processor = T.Gemma3ImageProcessorPil(size={"height": GEMMA3_IMAGE_SIZE, "width": GEMMA3_IMAGE_SIZE})
    processor = T.Gemma3Processor(image_processor=image_processor, tokenizer=tok, chat_template=tok.chat_template,
                                  image_seq_length=GEMMA3_IMAGE_TOKENS)  # fmt: skip
    gen = T.GenerationConfig(bos_token_id=bos, eos_token_id=[eos, eot], pad_token_id=pad, do_sample=True, top_k=64,
                             top_p=0.95)  # fmt: skip
    return T.Gemma3ForConditionalGeneration(config), processor, gen


def llava_next():
    """llava-v1.6-mistral-7b-hf with TRL's sizes (CLIP-L, patch 14, and Mistral, 2 layers each, width 16) but CLIP
    at 28 px, where TRL's tiny checkpoint keeps 336 px: with the pinpoints scaled alike (28/336) an image is 2 x 2
    patches a crop, the base crop and the anyres grid unpadded with a newline token a row as at 336 px, tens of
    image tokens a prompt instead of ~1,700 (which put TRL's own test_train_vlm over 600 s on the 2-core machine)."""
    import transformers as T

    tok = build_tokenizer(["<unk>", "<s>", "</s>", "<image>", "<pad>"], template("llava_next"), bos="<s>",
                          eos="</s>", pad="<pad>", unk="<unk>", add_bos=True,
                          extra_special_tokens={"image_token": "<image>"})  # fmt: skip
    bos, eos, pad, image = ids(tok, "<s>", "</s>", "<pad>", "<image>")
    text = dict(SMALL_TEXT, model_type="mistral", layer_types=None, vocab_size=len(tok), bos_token_id=bos,
                eos_token_id=eos, pad_token_id=pad)  # fmt: skip
    vision = {"model_type": "clip_vision_model", "num_hidden_layers": 2, "hidden_size": 16, "num_attention_heads": 4,
              "image_size": LLAVA_NEXT_IMAGE_SIZE, "patch_size": 14, "intermediate_size": 4096,
              "projection_dim": 768}  # fmt: skip
    side = LLAVA_NEXT_IMAGE_SIZE
    pinpoints = [[side, 2 * side], [2 * side, side], [2 * side, 2 * side], [3 * side, side], [side, 3 * side]]
    config = T.LlavaNextConfig(text_config=text, vision_config=vision, image_token_index=image,
                               image_grid_pinpoints=pinpoints, vision_feature_layer=-2)  # fmt: skip
    image_processor = T.LlavaNextImageProcessorPil(image_grid_pinpoints=pinpoints, size={"shortest_edge": side},
                                                   crop_size={"height": side, "width": side})  # fmt: skip
    processor = T.LlavaNextProcessor(image_processor=image_processor, tokenizer=tok, patch_size=14,
                                     vision_feature_select_strategy="default", chat_template=tok.chat_template,
                                     num_additional_image_tokens=1, image_token="<image>")  # fmt: skip
    gen = T.GenerationConfig(bos_token_id=bos, eos_token_id=eos, pad_token_id=pad)
    return T.LlavaNextForConditionalGeneration(config), processor, gen


class NotBuilt(Exception):
    """A stand-in this builder does not make, with the reason."""


def gemma4():
    """Not built: Gemma4Processor takes a video processor (torchvision-only here) and an audio feature extractor,
    so neither it nor TRL's test can load it in this environment; its case fails on TRL too (see docs/from_trl.md)."""
    raise NotBuilt("Gemma4Processor needs a video processor, which transformers only has with torchvision")
