"""Vision-language models on a tiny Qwen2-VL: prompts with images encoded through the processor (without
torchvision), the sampler's and the learner's log-probs against the model's own forward over each row with its
images, and the vision tower run once per prompt, not once per completion."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from grpokit.data.images import to_pil, with_image_entries
from grpokit.data.prompts import PromptSource
from grpokit.data.sources import DataError
from grpokit.models.vision import make_processor, register_processor
from grpokit.models.vision_inputs import VisionPrompt
from grpokit.rollout.engine import HFRolloutEngine
from grpokit.rollout.types import SamplingParams
from grpokit.train.learning.policy_logprobs import build_batch, completion_logprobs

pytestmark = pytest.mark.usefixtures("one_thread")
WORDS = ["red", "green", "blue", "colour", "?"]


@pytest.fixture(scope="module")
def vlm():
    from grpokit.testing.tiny_vlm import build_tiny_qwen2_vl

    model, tokenizer, images = build_tiny_qwen2_vl(words=WORDS, image_side=56)  # 16 patches, 4 image tokens an image
    processor = make_processor("qwen2_vl", images, tokenizer)  # no video processor: no torchvision needed
    register_processor(processor.tokenizer, processor)
    return model.float().eval(), processor


def rows():
    """Three one-image prompts of different sizes and one two-image plain-text prompt."""
    colours = [(255, 0, 0), (0, 255, 0), (0, 0, 255)]
    out = [
        {"prompt": [{"role": "user", "content": "colour ?"}], "images": [Image.new("RGB", (40, 30), c)]}
        for c in colours
    ]
    out.append(
        {"prompt": "colour ?", "images": [Image.new("RGB", (56, 56), (9, 9, 9)), np.zeros((80, 28, 3), np.uint8)]}
    )
    return out


def sampled(vlm, G=3, T=6):
    model, processor = vlm
    tokenizer = processor.tokenizer
    source = PromptSource(rows(), tokenizer, max_prompt_length=64)
    engine = HFRolloutEngine(model, [tokenizer.eos_token_id], tokenizer.pad_token_id, torch.device("cpu"), seed=0)
    return source, engine.generate([source.ids[i] for i in range(4)], G, SamplingParams.plain(T))


def own_forward(model, processor, source, rollouts):
    """Log-probs [N, T] from the model's own forward, one row at a time: the processor's inputs of the row's prompt
    (pixel values and all, as TRL repeats them per completion) with the completion appended, no position ids given
    (the model computes its M-RoPE positions itself)."""
    G = rollouts.num_generations
    out = torch.zeros_like(rollouts.logprobs)
    for n in range(rollouts.completion_ids.size(0)):
        prompt = rollouts.prompt_ids[n // G]
        length = int(rollouts.completion_mask[n].sum())
        completion = rollouts.completion_ids[n, :length]
        ids = torch.cat([torch.tensor(list(prompt)), completion])[None]  # [1, P+t]
        types = torch.cat([prompt.sequence["mm_token_type_ids"], torch.zeros(length, dtype=torch.long)])[None]
        with torch.no_grad():
            logits = model(input_ids=ids, mm_token_type_ids=types, **prompt.pixels).logits[0].float()  # [P+t, V]
        logp = torch.log_softmax(logits[len(prompt) - 1 : -1], -1)  # [t, V]
        out[n, :length] = logp.gather(-1, completion[:, None]).squeeze(-1)
    return out


def test_prompts_carry_images_and_sampler_and_learner_match_the_models_own_forward(vlm):
    model, processor = vlm
    source, rollouts = sampled(vlm)
    assert all(isinstance(p, VisionPrompt) for p in rollouts.prompt_ids)
    # 56x56 -> 4x4 patches of 14 -> 4 image tokens; the plain-text prompt got two image entries, the first 4 tokens
    assert [len(p.image_hashes) for p in rollouts.prompt_ids] == [1, 1, 1, 2]
    expected = own_forward(model, processor, source, rollouts)
    mask = rollouts.completion_mask
    assert float(((rollouts.logprobs - expected) * mask).abs().max()) < 1e-5  # the sampler's
    batch = build_batch(model, rollouts, processor.tokenizer.pad_token_id, torch.device("cpu"))
    with torch.no_grad():
        shared, _ = completion_logprobs(model, batch, 1.0)  # prompt once per group, on its KV cache
    assert float(((shared - expected) * mask).abs().max()) < 1e-5
    model.activation_checkpointing_enable()  # no KV cache: one full forward per row, each with its prompt's images
    try:
        with torch.no_grad():
            full, _ = completion_logprobs(model, batch, 1.0)
    finally:
        model.activation_checkpointing_disable()
    assert float(((full - expected) * mask).abs().max()) < 1e-5


def test_the_vision_tower_runs_once_per_prompt_not_per_completion(vlm):
    model, processor = vlm
    _, rollouts = sampled(vlm, G=4)
    patches = []
    hook = model.model.visual.register_forward_hook(lambda m, args, out: patches.append(args[0].size(0)))
    try:
        batch = build_batch(model, rollouts, processor.tokenizer.pad_token_id, torch.device("cpu"))
        completion_logprobs(model, batch, 1.0)[0].sum().backward()
    finally:
        hook.remove()
    # 5 images of 16 patches each (56 x 56 and the two-image prompt's 56 x 56 and 28 x 80 -> 2 x 4 ... 4 x 4): the
    # patches of the 4 prompts once, not G = 4 times
    per_prompt = sum(p.pixels["pixel_values"].size(0) for p in rollouts.prompt_ids)
    assert patches == [per_prompt]
    assert model.model.visual.patch_embed.proj.weight.grad is not None  # the tower trains through the shared pass


def test_images_come_from_pil_arrays_files_and_datasets_values_and_never_from_urls(tmp_path):
    red = Image.new("RGB", (4, 3), (255, 0, 0))
    red.save(tmp_path / "red.png")
    as_bytes = (tmp_path / "red.png").read_bytes()
    for value in (red, np.asarray(red), np.asarray(red) / 255.0, str(tmp_path / "red.png"), {"bytes": as_bytes}):
        assert to_pil(value, "row 0").getpixel((0, 0)) == (255, 0, 0)
    with pytest.raises(DataError, match="is a URL; grpokit reads no images from the network"):
        to_pil("https://example.com/cat.png", "row 0")
    with pytest.raises(DataError, match="does not exist"):
        to_pil(str(tmp_path / "missing.png"), "row 0")


def test_image_entries_are_placed_as_trl_places_them():
    assert with_image_entries("what ?", 2)[0]["content"] == [
        {"type": "image"},
        {"type": "image"},
        {"type": "text", "text": "what ?"},
    ]
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "what ?"}]
    placed = with_image_entries(messages, 1)
    assert placed[0] == messages[0] and placed[1]["content"][0] == {"type": "image"}
    has = [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image"}]}]
    assert with_image_entries(has, 1) is has
    with pytest.raises(DataError, match="1 image entries but its row has 2 images"):
        with_image_entries(has, 2)


def test_an_image_prompt_over_max_prompt_length_is_dropped_and_counted_never_cut(vlm):
    _, processor = vlm
    source = PromptSource(rows(), processor.tokenizer, max_prompt_length=15, overflow="truncate")
    # the three one-image prompts are 15 tokens; the two-image one (23) is dropped, though overflow says truncate
    assert source.num_dropped == 1 and source.num_truncated == 0
    assert sorted(source.usable.tolist()) == [0, 1, 2]


def test_images_without_a_processor_are_refused_in_one_line():
    from grpokit.testing import build_word_tokenizer

    with pytest.raises(DataError, match="holds images but the model has no image processor"):
        PromptSource(rows(), build_word_tokenizer(WORDS))
