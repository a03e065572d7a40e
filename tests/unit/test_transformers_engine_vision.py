"""generation.engine: transformers with prompts that carry images: model.generate gets TRL's batch (each prompt G
times, every row's pixel inputs), and its greedy tokens and log-probs equal grpokit's own sampler's on a tiny
Qwen2-VL in float32."""

from __future__ import annotations

import pytest
import torch
from PIL import Image

from grpokit.data.prompts import PromptSource
from grpokit.models.vision import make_processor, register_processor
from grpokit.models.vision_inputs import VisionPrompt
from grpokit.rollout.engine import HFRolloutEngine
from grpokit.rollout.transformers_engine import TransformersRolloutEngine
from grpokit.rollout.types import SamplingParams

pytestmark = pytest.mark.usefixtures("one_thread")
WORDS = ["red", "green", "blue", "colour", "?"]
CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def vlm():
    from grpokit.testing.tiny_vlm import build_tiny_qwen2_vl

    model, tokenizer, images = build_tiny_qwen2_vl(words=WORDS, image_side=56)  # 4 image tokens an image
    processor = make_processor("qwen2_vl", images, tokenizer)
    register_processor(processor.tokenizer, processor)
    rows = [
        {"prompt": [{"role": "user", "content": "colour ?"}], "images": [Image.new("RGB", (40, 30), (255, 0, 0))]},
        {"prompt": [{"role": "user", "content": "red green colour ?"}], "images": [Image.new("RGB", (56, 56), 90)]},
        {"prompt": "colour ?", "images": [Image.new("RGB", (56, 56), (0, 0, 255)), Image.new("RGB", (28, 80), 9)]},
    ]  # different prompt lengths (left padding) and a two-image prompt
    source = PromptSource(rows, processor.tokenizer, max_prompt_length=64)
    return model.float().eval(), processor.tokenizer, [source.ids[i] for i in range(3)]


def test_greedy_tokens_and_logprobs_equal_grpokits_sampler(vlm):
    model, tokenizer, prompts = vlm
    assert all(isinstance(p, VisionPrompt) for p in prompts)
    eos, pad = [tokenizer.eos_token_id], tokenizer.pad_token_id
    params = SamplingParams.plain(6, greedy=True)
    ours = HFRolloutEngine(model, eos, pad, CPU).generate(prompts, 2, params)
    calls = []
    real = model.generate

    def spy(**kwargs):  # what a patched generate sees: TRL's batch
        calls.append(kwargs)
        return real(**kwargs)

    model.generate = spy
    try:
        theirs = TransformersRolloutEngine(model, eos, pad, CPU).generate(prompts, 2, params)
    finally:
        del model.generate
    (call,) = calls
    assert call["input_ids"].shape[0] == 6  # 3 prompts x G = 2, each prompt's rows adjacent
    assert torch.equal(call["input_ids"][0], call["input_ids"][1])
    patches = [int(p.pixels["pixel_values"].size(0)) for p in prompts]
    assert call["pixel_values"].size(0) == 2 * sum(patches)  # every row's image, as TRL repeats them
    assert call["image_grid_thw"].size(0) == 2 * 4  # 1 + 1 + 2 images, twice
    assert call["mm_token_type_ids"].shape == call["input_ids"].shape
    assert all(isinstance(p, VisionPrompt) for p in theirs.prompt_ids)

    assert torch.equal(theirs.completion_mask, ours.completion_mask)
    assert torch.equal(
        theirs.completion_ids * theirs.completion_mask.long(), ours.completion_ids * ours.completion_mask.long()
    )
    assert theirs.finish_reasons == ours.finish_reasons
    assert float((theirs.logprobs - ours.logprobs).abs().max()) < 1e-5
    assert float(ours.logprobs.abs().sum()) > 0  # real log-probs were compared, not zeros


def test_the_engine_takes_images_and_the_refusal_is_lifted():
    from types import SimpleNamespace

    from grpokit.compose.vision_paths import check_image_paths
    from grpokit.rollout.engines import ENGINES

    assert ENGINES["transformers"].takes_images
    prompts = SimpleNamespace(ids=[VisionPrompt([1, 2], {}, {}, ["h"])])
    args = SimpleNamespace(backend="none", distributed=SimpleNamespace(staleness_bound=lambda: 0))
    check_image_paths(args, "transformers", prompts, SimpleNamespace(world_size=1), None, None)  # no error
