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


def test_prompt_images_and_tool_images_reach_generate_in_placeholder_order():
    """Prompts with images and a tool that returns one, through TRL's round loop: every generate call gets each row's
    prompt pixel inputs (VisionPrompt.pixels) then its tools', in the order of the row's image placeholders, and
    the log-probs equal the model's own forward over prompt and tool images to 1e-5 in float32."""
    from PIL import Image

    from grpokit.testing.tiny_vlm import build_tiny_qwen2_vl

    model, tokenizer, images = build_tiny_qwen2_vl(words=WORDS, image_side=56)  # 4 image tokens an image
    model = model.float().eval()
    processor = make_processor("qwen2_vl", images, tokenizer)
    chat = ConversationTokens(processor.tokenizer, processor=processor)
    engine = TransformersRolloutEngine(
        model, [tokenizer.eos_token_id, chat.end_of_turn], tokenizer.pad_token_id, torch.device("cpu"), seed=1
    )
    picture = lambda rgb: {"type": "image", "image": Image.new("RGB", (30, 40), rgb)}
    prompts = [
        [{"role": "user", "content": [picture((9, 9, 9)), {"type": "text", "text": "colour ?"}]}],
        [{"role": "user", "content": [picture((200, 0, 90)), picture((0, 90, 200)), {"type": "text", "text": "?"}]}],
    ]
    calls, rows, real = [], [], model.generate
    model.generate = lambda **kwargs: calls.append(kwargs) or real(**kwargs)
    try:
        with ToolExecutor([screenshot], isolation="thread") as executor:
            multi = TransformersMultiTurnEngine(engine, chat, executor, max_tool_calling_iterations=2, parser=parser)
            multi.on_generate = rows.append  # the rollouts each call sampled, in row order
            rollouts = multi.generate(prompts, 3, SamplingParams.plain(60))
    finally:
        del model.generate
    assert [len(p.image_hashes) for p in rollouts.prompt_ids] == [1, 2]
    counts = [len(h) for h in rollouts.completion_image_hashes]
    assert max(counts) >= 1 and len(calls) >= 2, counts  # some row had a tool show an image
    image_id = model.config.image_token_id
    assert rows[0] == list(range(6))
    for call, active in zip(calls, rows):
        ids = call["input_ids"]
        assert torch.equal(call["mm_token_type_ids"], (ids == image_id).long() * call["attention_mask"])
        expected = []  # each row: its prompt's patches, then its tools' so far (one merged token per 4 patches)
        for k, n in enumerate(active):
            prompt = rollouts.prompt_ids[n // 3].pixels["pixel_values"]
            tools = rollouts.completion_pixels[n]
            mine = torch.cat([prompt, tools["pixel_values"]]) if tools is not None else prompt
            expected.append(mine[: int((ids[k] == image_id).sum()) * 4])
        assert int((ids[0] == image_id).sum()) >= 4 and "position_ids" not in call
        torch.testing.assert_close(call["pixel_values"], torch.cat(expected), atol=0, rtol=0)
    expected = own_forward(model, processor, rollouts, prompts)  # [N, T]: prompt images and tool images
    sampled = rollouts.loss_mask.bool()
    torch.testing.assert_close(rollouts.logprobs[sampled], expected[sampled], atol=1e-5, rtol=0)
