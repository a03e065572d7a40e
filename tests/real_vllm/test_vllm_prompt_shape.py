"""grpokit's vLLM prompts use only keys of vLLM's own TokensPrompt TypedDict, with multi_modal_data and
multi_modal_uuids keyed by modality as vLLM's MultiModalDataDict is (no engine started)."""

from __future__ import annotations

import torch
from PIL import Image

from grpokit.models.vision_inputs import VisionPrompt, image_hash
from grpokit.rollout.vllm.prompts import vllm_prompt


def test_vllm_prompt_keys_are_vllms_tokens_prompt_keys():
    from vllm.inputs import TokensPrompt
    from vllm.inputs.llm import MultiModalDataBuiltins

    image = Image.new("RGB", (28, 28), (255, 0, 0))
    prompt = VisionPrompt([1, 2, 3], {}, {"pixel_values": torch.zeros(4, 1176)}, [image_hash(image)], [image])
    out = vllm_prompt(prompt)
    keys = TokensPrompt.__required_keys__ | TokensPrompt.__optional_keys__
    assert set(out) <= keys and TokensPrompt.__required_keys__ <= set(out)
    assert set(out["multi_modal_data"]) <= set(MultiModalDataBuiltins.__annotations__)  # "image"
    assert set(vllm_prompt([1, 2])) == {"prompt_token_ids"}
