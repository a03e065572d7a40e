"""What a prompt with images sends to a Ray rollout worker and what comes back (grpokit/models/vision_inputs.py's
for_workers, ids_only, with_driver_prompts; grpokit/distributed/ray_rollout.py uses them): the token ids and the
processor's inputs go, once per prompt, without the PIL images; only the ids come back, and the driver's own prompts
(images and all) take their place."""

from __future__ import annotations

import pickle

import pytest
import torch
from PIL import Image

from grpokit.models.vision_inputs import VisionPrompt, for_workers, ids_only, with_driver_prompts


@pytest.fixture(scope="module")
def prompt():
    """A 224 x 224 picture through the tiny Qwen2-VL's processor: 256 patches of 3 x 2 x 14 x 14 = 1,176 floats."""
    from grpokit.data.images import encode
    from grpokit.models.vision import make_processor
    from grpokit.testing.tiny_vlm import build_tiny_qwen2_vl

    _, tokenizer, images = build_tiny_qwen2_vl(words=["red", "colour", "?"], image_side=224)
    picture = Image.effect_noise((224, 224), 64).convert("RGB")  # noise: its PNG does not compress away
    return encode(make_processor("qwen2_vl", images, tokenizer), "colour ?", [picture])[1]


def test_a_worker_gets_the_ids_and_pixel_inputs_without_the_pil_images(prompt):
    sent = for_workers(prompt)
    assert isinstance(sent, VisionPrompt) and list(sent) == list(prompt) and sent.images == []
    assert sent.pixels is prompt.pixels and sent.sequence is prompt.sequence  # the same tensors, not copies
    assert sent.image_hashes == prompt.image_hashes and prompt.images  # the driver's copy keeps its image
    assert for_workers([1, 2, 3]) == [1, 2, 3]  # a text prompt as it is
    pixel_bytes = prompt.pixels["pixel_values"].numel() * 4  # 256 x 1,176 float32 = 1,204,224 bytes
    assert prompt.pixels["pixel_values"].shape == (256, 1176) and pixel_bytes == 1_204_224
    size, with_image = len(pickle.dumps(sent)), len(pickle.dumps(prompt))
    # the pixel values and a few hundred bytes (ids, grid, hash); the PIL image would add its 150,528 RGB bytes
    assert pixel_bytes < size < pixel_bytes + 2_000, size
    assert with_image - size > 224 * 224 * 3, (with_image, size)


def test_only_the_ids_come_back_and_the_driver_puts_its_prompts_back(prompt):
    returned = ids_only([pickle.loads(pickle.dumps(for_workers(prompt)))])  # as the worker's rollouts send them
    assert type(returned[0]) is list and returned[0] == list(prompt)
    assert len(pickle.dumps(returned)) < 4 * len(prompt) + 100  # ids only: no pixel tensor travels back
    restored = with_driver_prompts(returned, [prompt])
    assert restored[0] is prompt and restored[0].images  # the store and the rewards get the driver's images
    assert with_driver_prompts([[1, 2]], [[1, 2]]) == [[1, 2]]
    other = VisionPrompt([*prompt, 7], prompt.sequence, prompt.pixels, prompt.image_hashes)
    with pytest.raises(RuntimeError, match="other prompts than it was sent"):
        with_driver_prompts(returned, [other])
    with pytest.raises(RuntimeError, match="other prompts than it was sent"):
        with_driver_prompts(returned, [prompt, prompt])
    assert torch.equal(restored[0].pixels["pixel_values"], prompt.pixels["pixel_values"])
