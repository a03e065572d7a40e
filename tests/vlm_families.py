"""Tiny VLM families beyond TRL's list (scripts/vlm_fixture_families.py builds those), for the per-family log-prob
parity test: real transformers model and processor classes with the PIL image processors (no torchvision), a word
tokenizer carrying each family's image tokens, and a chat template placing them. Each builder returns
(model, processor, generation config or None)."""

from __future__ import annotations

import transformers as T

from grpokit.testing import build_word_tokenizer

WORDS = ["What", "is", "this?", "red", "blue", "user", "assistant", ":"]
SMALL_TEXT = {"num_hidden_layers": 2, "hidden_size": 16, "num_attention_heads": 4, "num_key_value_heads": 2,
              "intermediate_size": 32}  # fmt: skip
SMALL_VISION = {"num_hidden_layers": 1, "hidden_size": 16, "num_attention_heads": 4, "intermediate_size": 32,
                "patch_size": 14}  # fmt: skip


def template(image: str, bos: str = "") -> str:
    """A chat template writing ``image`` for each image entry; ``bos`` first where the family's template writes one."""
    return (
        bos + "{% for m in messages %}{{ m['role'] }} : {% if m['content'] is string %}{{ m['content'] }} "
        "{% else %}{% for c in m['content'] %}{% if c['type'] == 'image' %}" + image + " "
        "{% elif c['type'] == 'text' %}{{ c['text'] }} {% endif %}{% endfor %}{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}assistant : {% endif %}"
    )


def tokenizer_with(specials: list[str], **named: str):
    """The word tokenizer with ``specials`` added; ``named``: attributes such as ``image_token`` processors read."""
    tok = build_word_tokenizer(WORDS)
    tok.add_special_tokens({"additional_special_tokens": specials})
    for name, token in named.items():
        setattr(tok, name, token)
        setattr(tok, f"{name}_id", tok.convert_tokens_to_ids(token))
    return tok


def text_config(tok, model_type: str) -> dict:
    return dict(SMALL_TEXT, model_type=model_type, vocab_size=len(tok), bos_token_id=tok.bos_token_id,
                eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)  # fmt: skip


def llava():
    """LLaVA 1.5 (CLIP + Llama): 28 px images, 4 patches, the CLS feature dropped ("default"): 4 image tokens."""
    tok = tokenizer_with(["<image>"], image_token="<image>")
    tok.chat_template = template("<image>")
    vision = dict(SMALL_VISION, model_type="clip_vision_model", image_size=28, projection_dim=16)
    config = T.LlavaConfig(text_config=text_config(tok, "llama"), vision_config=vision, image_seq_length=4,
                           image_token_index=tok.image_token_id, vision_feature_layer=-1)  # fmt: skip
    images = T.CLIPImageProcessorPil(size={"shortest_edge": 28}, crop_size={"height": 28, "width": 28})
    processor = T.LlavaProcessor(image_processor=images, tokenizer=tok, patch_size=14, image_token="<image>",
                                 vision_feature_select_strategy="default", num_additional_image_tokens=1,
                                 chat_template=tok.chat_template)  # fmt: skip
    return T.LlavaForConditionalGeneration(config), processor, None


def paligemma(text_type: str = "gemma"):
    """PaliGemma (SigLIP + Gemma; PaliGemma 2: ``text_type="gemma2"``, Gemma 2's sliding-window layers, a window of
    8 tokens so the prompt outgrows it): 28 px images, 4 image tokens, the processor's BOS after the images."""
    tok = tokenizer_with(["<image>"], image_token="<image>")
    tok.chat_template = template("<image>")
    vision = dict(SMALL_VISION, model_type="siglip_vision_model", image_size=28, projection_dim=16)
    text = dict(text_config(tok, text_type), head_dim=4)
    if text_type == "gemma2":
        text.update(sliding_window=8, layer_types=["sliding_attention", "full_attention"])
    config = T.PaliGemmaConfig(text_config=text, vision_config=vision, image_token_index=tok.image_token_id,
                               projection_dim=16)  # fmt: skip
    images = T.SiglipImageProcessorPil(size={"height": 28, "width": 28})
    images.image_seq_length = 4
    processor = T.PaliGemmaProcessor(image_processor=images, tokenizer=tok, chat_template=tok.chat_template)
    config.text_config.vocab_size = len(tok)  # the processor adds PaliGemma's <loc> and <seg> tokens
    return T.PaliGemmaForConditionalGeneration(config), processor, None


def idefics3():
    """Idefics3 / SmolVLM (SigLIP + Llama, pixel shuffle 2): 28 px images, no splitting: 1 image token each."""
    tags = ["<fake_token_around_image>", "<image>", "<end_of_utterance>", "<global-img>"]
    tags += [f"<row_{i}_col_{j}>" for i in range(1, 7) for j in range(1, 7)]
    tok = tokenizer_with(tags, image_token="<image>")
    tok.chat_template = template("<image>", bos="{{ bos_token }}")
    vision = dict(SMALL_VISION, model_type="idefics3_vision", image_size=28)
    config = T.Idefics3Config(text_config=text_config(tok, "llama"), vision_config=vision, scale_factor=2,
                              image_token_id=tok.image_token_id)  # fmt: skip
    images = T.Idefics3ImageProcessorPil(size={"longest_edge": 28}, max_image_size={"longest_edge": 28},
                                         do_image_splitting=False)  # fmt: skip
    processor = T.Idefics3Processor(image_processor=images, tokenizer=tok, image_seq_len=1,
                                    chat_template=tok.chat_template)  # fmt: skip
    return T.Idefics3ForConditionalGeneration(config), processor, None


def qwen3_vl():
    """Qwen3-VL (its vision tower with deepstack features, interleaved M-RoPE), TRL's Qwen recipe's tokenizer."""
    import vlm_fixture_families as F  # scripts/: the Qwen tokenizer and processor of TRL's recipes

    tok = F.qwen_tokenizer(F.template("qwen3_5_nothink"))
    rope = {"rope_type": "default", "mrope_section": [1, 1, 0], "mrope_interleaved": True, "rope_theta": 5000000.0}
    text = dict(SMALL_TEXT, vocab_size=len(tok), rope_parameters=rope, head_dim=4)
    text.update(eos_token_id=F.ids(tok, "<|im_end|>")[0], pad_token_id=F.ids(tok, "<|endoftext|>")[0])
    vision = {"hidden_size": 16, "depth": 2, "num_heads": 4, "intermediate_size": 32, "out_hidden_size": 16,
              "deepstack_visual_indexes": [0]}  # fmt: skip
    config = T.Qwen3VLConfig(text_config=text, vision_config=vision, **F.qwen_token_ids(tok))
    image_processor = T.Qwen2VLImageProcessorPil(patch_size=16, merge_size=2, temporal_patch_size=2)
    processor = F.qwen_processor(T.Qwen3VLProcessor, image_processor, tok)
    return T.Qwen3VLForConditionalGeneration(config), processor, None


BUILDERS = {"llava": llava, "paligemma": paligemma, "paligemma2": lambda: paligemma("gemma2"), "idefics3": idefics3,
            "qwen3_vl": qwen3_vl}  # fmt: skip
