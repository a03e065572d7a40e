"""Tools that return images on a tiny Qwen2-VL (grpokit's own multi-turn sampler with the processor): the tool's image
is rendered into the next turn with its placeholder widened to the image's patches, the rollouts carry each
completion's pixel inputs (``Rollouts.completion_pixels``), and the sampler's, the learner's and the reference's
log-probs equal the model's own forward over each whole conversation (the row's own images, read back from its tool
messages, and the model's own M-RoPE positions) to 1e-5 in float32. The batch mixes rows with 0, 1 and 2 tool
images of different colours, so a wrong pixel slice between rows (TRL's #6274) changes the numbers."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from PIL import Image

from grpokit.models.vision import make_processor
from grpokit.rollout.engine import HFRolloutEngine
from grpokit.rollout.multiturn import MultiTurnEngine
from grpokit.rollout.seeding import concat_rollouts, split_rollouts
from grpokit.rollout.types import SamplingParams
from grpokit.tools import ConversationTokens, ToolCall, ToolExecutor
from grpokit.train.learning.policy_logprobs import batched_logprobs, build_batch, completion_logprobs

pytestmark = pytest.mark.usefixtures("one_thread")
WORDS = ["red", "green", "blue", "colour", "?", "look"]
COLOURS = [(255, 0, 0), (0, 200, 0), (0, 0, 255), (90, 90, 20)]


def screenshot(k: int) -> list:
    """Take a screenshot.

    Args:
        k: Which screen.
    """
    return [{"type": "image", "image": Image.new("RGB", (40, 30), COLOURS[k % 4])}, {"type": "text", "text": "look"}]


def parser(text: str) -> list[ToolCall]:
    """A random model writes no real call: a turn whose length is not a multiple of 3 calls screenshot."""
    n = len(text)
    return [] if n % 3 == 0 else [ToolCall("screenshot", {"k": n}, text, 0, n)]


@pytest.fixture(scope="module", params=["qwen2_vl", "qwen2_5_vl"])
def vlm(request):
    if request.param == "qwen2_vl":
        from grpokit.testing.tiny_vlm import build_tiny_qwen2_vl

        model, tokenizer, images = build_tiny_qwen2_vl(words=WORDS, image_side=56)  # 4 image tokens an image
        return model.float().eval(), make_processor("qwen2_vl", images, tokenizer)
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
    families = pytest.importorskip("vlm_fixture_families")  # TRL's recipe and chat template (trl ships it)
    model, processor, _ = families.qwen2_vl("2.5")
    return model.float().eval(), processor


def sample(vlm, seed=1, length=60):
    model, processor = vlm
    tokenizer = processor.tokenizer
    chat = ConversationTokens(tokenizer, processor=processor)
    stops = [tokenizer.eos_token_id, chat.end_of_turn]
    engine = HFRolloutEngine(model, stops, tokenizer.pad_token_id, torch.device("cpu"), seed=seed)
    prompts = [[{"role": "user", "content": "colour ?"}], [{"role": "user", "content": "look ?"}]]
    with ToolExecutor([screenshot], isolation="thread") as executor:
        multi = MultiTurnEngine(engine, chat, executor, max_tool_calling_iterations=2, parser=parser)
        return multi.generate(prompts, 3, SamplingParams.plain(length, suppress_tokens=rare(tokenizer, chat)))


def rare(tokenizer, chat) -> tuple[int, ...]:
    """A large vocabulary's random model almost never ends a turn: sample among 12 words and the end of turn only
    (a logits processor: the log-probs stay the model's own)."""
    if len(tokenizer) < 1000:
        return ()
    keep = {chat.end_of_turn, *range(300, 312)}
    return tuple(i for i in range(len(tokenizer)) if i not in keep)


def own_forward(model, processor, rollouts) -> torch.Tensor:
    """[N, T] log-probs of every completion token from the model's own forward over its row alone: the prompt and
    completion ids, pixel inputs the processor builds from the row's tool images (taken from its tool messages, not
    from completion_pixels), no position ids (the model computes its M-RoPE positions)."""
    image_id = model.config.image_token_id
    out = torch.zeros_like(rollouts.logprobs)
    for n, conversation in enumerate(rollouts.conversations):
        prompt = rollouts.prompt_ids[n // rollouts.num_generations]
        length = int(rollouts.completion_mask[n].sum())
        completion = rollouts.completion_ids[n, :length]
        ids = torch.cat([torch.tensor(list(prompt)), completion])[None]  # [1, P+t]
        images = [
            p["image"]
            for m in conversation.messages
            if m["role"] == "tool" and isinstance(m["content"], list)
            for p in m["content"]
            if p["type"] == "image"
        ]
        extra = {}
        if images:
            extra = dict(processor.image_processor(images=images, return_tensors="pt"))
            extra["mm_token_type_ids"] = (ids == image_id).long()
        with torch.no_grad():
            logits = model(input_ids=ids, **extra).logits[0].float()  # [P+t, V]
        logp = torch.log_softmax(logits[len(prompt) - 1 : -1], -1)  # [t, V]
        out[n, :length] = logp.gather(-1, completion[:, None]).squeeze(-1)
    return out


def test_tool_images_reach_the_model_and_logprobs_match_its_own_forward(vlm):
    model, processor = vlm
    rollouts = sample(vlm)
    counts = [len(h) for h in rollouts.completion_image_hashes]
    assert 0 in counts and len(set(counts)) >= 2, counts  # rows without tool images beside rows with 1 or 2
    image_id = model.config.image_token_id
    for n, count in enumerate(counts):
        pixels = rollouts.completion_pixels[n]
        assert (pixels is None) == (count == 0)
        placeholders = int((rollouts.completion_ids[n] == image_id).sum())
        if count:  # each image's placeholder widened to its merged patches; never sampled (loss mask 0 on them)
            assert pixels["image_grid_thw"].shape == (count, 3)
            assert placeholders == int(pixels["image_grid_thw"].prod(-1).sum()) // 4 > count
            assert rollouts.loss_mask[n][rollouts.completion_ids[n] == image_id].sum() == 0
        else:
            assert placeholders == 0
    expected = own_forward(model, processor, rollouts)  # [N, T]
    sampled = rollouts.loss_mask.bool()
    torch.testing.assert_close(rollouts.logprobs[sampled], expected[sampled], atol=1e-5, rtol=0)
    batch = build_batch(model, rollouts, processor.tokenizer.pad_token_id, torch.device("cpu"))
    learner, _ = completion_logprobs(model, batch, 1.0)  # with grad, every completion token (the tool's too)
    real = rollouts.completion_mask.bool()
    torch.testing.assert_close(learner.detach()[real], expected[real], atol=1e-5, rtol=0)
    # the reference's no-grad pass, two rows a chunk: chunks of rows with and without tool images
    reference = batched_logprobs(model, batch, 1.0, micro_batch_size=2)
    torch.testing.assert_close(reference[real], expected[real], atol=1e-5, rtol=0)


def test_split_and_joined_rollouts_keep_each_completions_images(vlm):
    rollouts = sample(vlm, seed=3)
    parts = split_rollouts(rollouts, 2)
    assert [len(p.completion_pixels) for p in parts] == [3, 3]
    joined = concat_rollouts(parts, 0)
    assert joined.completion_image_hashes == rollouts.completion_image_hashes
    for a, b in zip(joined.completion_pixels, rollouts.completion_pixels):
        assert (a is None and b is None) or torch.equal(a["pixel_values"], b["pixel_values"])
