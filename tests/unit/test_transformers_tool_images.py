"""Tools that return images in TRL's round loop with model.generate (grpokit/rollout/transformers_multiturn.py) on a
tiny Qwen2-VL: the rows a tool showed an image generate their next turn with the images' pixel inputs and image-token
type ids (TRL's layout), the rollouts carry each completion's pixel inputs as grpokit's own multi-turn engine fills
them, and the log-probs equal the model's own forward over each whole conversation to 1e-5 in float32."""

from __future__ import annotations

import pytest
import torch
from test_tool_image_rollouts import WORDS, own_forward, parser, screenshot

from grpokit.models.vision import make_processor
from grpokit.rollout.transformers_engine import TransformersRolloutEngine
from grpokit.rollout.transformers_multiturn import TransformersMultiTurnEngine
from grpokit.rollout.types import SamplingParams
from grpokit.tools import ConversationTokens, ToolExecutor

pytestmark = pytest.mark.usefixtures("one_thread")


def test_tool_images_reach_generate_and_the_rollouts():
    from grpokit.testing.tiny_vlm import build_tiny_qwen2_vl

    model, tokenizer, images = build_tiny_qwen2_vl(words=WORDS, image_side=56)  # 4 image tokens an image
    model = model.float().eval()
    processor = make_processor("qwen2_vl", images, tokenizer)
    chat = ConversationTokens(processor.tokenizer, processor=processor)
    stops = [tokenizer.eos_token_id, chat.end_of_turn]
    engine = TransformersRolloutEngine(model, stops, tokenizer.pad_token_id, torch.device("cpu"), seed=1)
    calls = []
    real = model.generate

    def spy(**kwargs):
        calls.append(kwargs)
        return real(**kwargs)

    prompts = [[{"role": "user", "content": "colour ?"}], [{"role": "user", "content": "look ?"}]]
    model.generate = spy
    try:
        with ToolExecutor([screenshot], isolation="thread") as executor:
            multi = TransformersMultiTurnEngine(engine, chat, executor, max_tool_calling_iterations=2, parser=parser)
            rollouts = multi.generate(prompts, 3, SamplingParams.plain(60))
    finally:
        del model.generate
    counts = [len(h) for h in rollouts.completion_image_hashes]
    assert max(counts) >= 1 and len(set(counts)) >= 2, counts  # rows with 1 and 2 tool images
    assert calls[0]["input_ids"].size(0) == 6 and "pixel_values" not in calls[0]  # text prompts: no image yet
    image_id = model.config.image_token_id
    for call in calls[1:]:  # every later round's rows had a tool show an image
        ids = call["input_ids"]
        assert torch.equal(call["mm_token_type_ids"], (ids == image_id).long() * call["attention_mask"])
        patches = int((ids == image_id).sum()) * 4  # one merged token per 4 patches
        assert call["pixel_values"].size(0) == patches and "position_ids" not in call
    for n, count in enumerate(counts):
        pixels = rollouts.completion_pixels[n]
        assert (pixels is None) == (count == 0)
        if count:
            assert pixels["image_grid_thw"].shape == (count, 3)
    expected = own_forward(model, processor, rollouts)  # [N, T]
    sampled = rollouts.loss_mask.bool()
    torch.testing.assert_close(rollouts.logprobs[sampled], expected[sampled], atol=1e-5, rtol=0)
