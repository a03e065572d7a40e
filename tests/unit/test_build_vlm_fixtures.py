"""scripts/build_vlm_fixtures.py: the offline stand-ins of TRL's VLM test cases load as TRL loads them, the
Qwen3.5 tokenizer decodes the real ids TRL's multimodal tool test writes, and zen-multi-image has TRL's layout."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

build = pytest.importorskip("build_vlm_fixtures")  # needs trl (its chat templates), as the suite does
datasets_mod = pytest.importorskip("vlm_fixture_datasets")
families = pytest.importorskip("vlm_fixture_families")


def test_gemma3_stand_in_loads_and_its_processor_makes_pixel_values(tmp_path):
    import torch
    from PIL import Image
    from transformers import AutoModelForImageTextToText, AutoProcessor

    folder = build.build_model("tiny-Gemma3ForConditionalGeneration", tmp_path)
    model = AutoModelForImageTextToText.from_pretrained(folder)
    processor = AutoProcessor.from_pretrained(folder)
    assert type(model).__name__ == "Gemma3ForConditionalGeneration" and type(processor).__name__ == "Gemma3Processor"
    assert processor.chat_template == families.template("gemma3")  # TRL recognises the template by identity
    image = Image.new("RGB", (40, 33), "green")
    messages = [{"role": "user", "content": [{"type": "image", "image": image}, {"type": "text", "text": "Colour?"}]}]
    inputs = processor.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=True, return_tensors="pt"
    )
    assert tuple(inputs["pixel_values"].shape) == (1, 3, 56, 56)  # SigLIP at 56 px (TRL's checkpoint: 224)
    image_token = processor.tokenizer.convert_tokens_to_ids("<image_soft_token>")
    assert int((inputs["input_ids"] == image_token).sum()) == 16  # mm_tokens_per_image: (56 / 14) ** 2 patches
    with torch.no_grad():
        logits = model(**inputs).logits
    assert logits.shape[-1] == len(processor.tokenizer) and not torch.isnan(logits).any()
    assert build.build_model("tiny-Gemma3ForConditionalGeneration", tmp_path) == folder  # kept, not rebuilt


def test_llava_next_stand_in_tiles_an_image_into_anyres_crops_at_28_px(tmp_path):
    import torch
    from PIL import Image
    from transformers import AutoModelForImageTextToText, AutoProcessor

    folder = build.build_model("tiny-LlavaNextForConditionalGeneration", tmp_path)
    model = AutoModelForImageTextToText.from_pretrained(folder)
    processor = AutoProcessor.from_pretrained(folder)
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Colour?"}]}]
    text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    inputs = processor(text=[text], images=[Image.new("RGB", (40, 33), "green")], return_tensors="pt")
    # 40 wide x 33 high: of the pinpoints (h, w) 28x56, 56x28, 56x56, 84x28, 28x84, only 56x56 holds all 1,320
    # pixels scaled up (x1.4 -> 56 x 46), so the base crop and 2 x 2 crops of 28 px: 5 crops of 3 x 28 x 28
    assert tuple(inputs["pixel_values"].shape) == (1, 5, 3, 28, 28)
    # tokens: base crop 2 x 2 patches = 4 (CLS dropped by the default strategy); the 4 x 4 grid unpadded
    # (33 * 4 / 40 = 3.3 -> 3 rows, padding (4 - 3) // 2 = 0) = 16, plus one newline a row = 4: 24
    image_token = processor.tokenizer.convert_tokens_to_ids("<image>")
    assert int((inputs["input_ids"] == image_token).sum()) == 24
    with torch.no_grad():
        logits = model(**inputs).logits
    assert logits.shape[-1] == len(processor.tokenizer) and not torch.isnan(logits).any()


def test_qwen2_vl_stand_in_loads_without_torchvision_and_counts_its_image_tokens(tmp_path):
    import torch
    from PIL import Image
    from transformers import AutoModelForImageTextToText, AutoProcessor

    folder = build.build_model("tiny-Qwen2VLForConditionalGeneration", tmp_path)
    model = AutoModelForImageTextToText.from_pretrained(folder)
    processor = AutoProcessor.from_pretrained(folder)
    assert processor.chat_template == families.template("qwen2_5_vl")
    messages = [{"role": "user", "content": [{"type": "image", "image": Image.new("RGB", (56, 84))}]}]
    inputs = processor.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=True, return_tensors="pt"
    )
    # 56 wide x 84 high in 14-px patches: a 6 x 4 (h x w) grid; merged 2 x 2: 6 image tokens; 24 patch rows of
    # 3 channels * 2 frames * 14 * 14 = 1176 values
    assert inputs["image_grid_thw"].tolist() == [[1, 6, 4]] and tuple(inputs["pixel_values"].shape) == (24, 1176)
    image_token = processor.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    assert int((inputs["input_ids"] == image_token).sum()) == 6
    with torch.no_grad():
        assert not torch.isnan(model(**inputs).logits).any()


def test_qwen3_5_tokenizer_decodes_the_real_ids_of_trls_multimodal_tool_test():
    tok = families.qwen_tokenizer(families.template("qwen3_5_nothink"), 248044, families.QWEN3_5_PINNED)
    # the ids of TRL's test_train_with_tools_multimodal_response (Qwen3.5's real vocabulary)
    call = [248058, 198, 27, 1628, 13744, 30091, 22076, 29, 198, 510, 1628, 29, 198, 248059, 248046]
    assert tok.decode(call) == "<tool_call>\n<function=screenshot_tool>\n</function>\n</tool_call><|im_end|>"
    assert tok.decode([40, 1459, 914, 1366, 866, 5224, 248046]) == "I don't know any tool<|im_end|>"
    assert tok.decode([16936, 0, 248046]) == "Done!<|im_end|>"
    assert tok.pad_token_id == 248044 and tok.convert_tokens_to_ids("<|image_pad|>") == 248056
    assert tok.image_token == "<|image_pad|>" and len(tok) == 248044 + 26


def test_zen_multi_image_rows_take_trls_layout():
    from datasets import Dataset, DatasetDict

    texts = [f"question {i}?" for i in range(19)]
    texts[15] = "Is never better than *right* now?"
    rows = Dataset.from_dict({"prompt": [[{"role": "user", "content": t}] for t in texts]})
    zen = DatasetDict(train=rows.select(range(17)), test=rows.select(range(17, 19)))
    import numpy as np

    multi = datasets_mod.with_images(zen, True, np.random.default_rng(0))
    assert multi.num_rows == {"train": 17, "test": 2}
    row = multi["train"][15]
    assert [p["type"] for p in row["prompt"][0]["content"]] == ["text", "image", "text"]
    assert [p["text"] for p in row["prompt"][0]["content"]] == ["Is", None, " never better than *right* now?"]
    counts = [len(r["images"]) for r in multi["train"]] + [len(r["images"]) for r in multi["test"]]
    assert counts == [1, 1, 2, 2, 1, 1, 2, 0, 2, 3, 1, 1, 3, 0, 1, 1, 1, 1, 0]
    assert all(32 <= side < 64 for r in multi["train"] for im in r["images"] for side in im.size)
    single = datasets_mod.with_images(zen, False, np.random.default_rng(0))
    assert single["test"].column_names == ["prompt", "image"] and single["test"][0]["image"].mode == "RGB"
