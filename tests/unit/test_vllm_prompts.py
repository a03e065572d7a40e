"""vLLM's prompts of grpokit's prompts: token ids alone, or with a prompt's images as multi_modal_data (vLLM's
TokensPrompt shape; tests/real_vllm/test_vllm_prompt_shape.py checks the keys against vLLM's own TypedDict)."""

from __future__ import annotations

import torch
from PIL import Image

from grpokit.models.vision_inputs import VisionPrompt, image_hash
from grpokit.rollout.vllm.prompts import vllm_prompt


def test_a_text_prompt_is_its_token_ids():
    assert vllm_prompt([5, 6, 7]) == {"prompt_token_ids": [5, 6, 7]}


def test_a_prompt_with_images_carries_them_in_order_with_their_hashes():
    red, blue = Image.new("RGB", (28, 28), (255, 0, 0)), Image.new("RGB", (28, 56), (0, 0, 255))
    pixels = {"pixel_values": torch.zeros(12, 1176), "image_grid_thw": torch.tensor([[1, 2, 2], [1, 4, 2]])}
    prompt = VisionPrompt([1, 9, 9, 9, 2], {}, pixels, [image_hash(red), image_hash(blue)], [red, blue])
    out = vllm_prompt(prompt)
    assert out["prompt_token_ids"] == [1, 9, 9, 9, 2] and type(out["prompt_token_ids"]) is list
    assert out["multi_modal_data"]["image"] == [red, blue]  # PIL images, the prompt's order: vLLM processes them
    assert out["multi_modal_uuids"]["image"] == [image_hash(red), image_hash(blue)]
    assert image_hash(red) != image_hash(blue)
