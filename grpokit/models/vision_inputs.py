"""A prompt's processor inputs (``pixel_values``, ``image_grid_thw``, ``mm_token_type_ids`` ...) travelling with its
token ids, batched for the model, and the position ids of models with multimodal rotary positions (Qwen2-VL's
M-RoPE: [3, B, L], from the images' grids).

A :class:`VisionPrompt` is the prompt's token ids (a ``list``, so every part that passes prompt ids along carries it
unchanged) with its inputs: the sampler prefills it with them, the learner and the reference run it once per group
with them (the vision tower runs once per prompt, its G completions read the prompt's KV cache), evaluation too.
"""

from __future__ import annotations

import hashlib
from typing import Any

import torch


class VisionPrompt(list):
    """Token ids of a prompt with images, and the processor's other inputs for it.

    ``sequence``: inputs aligned with the tokens ([P] each: ``mm_token_type_ids``, ``token_type_ids``), left-padded
    with the ids; ``pixels``: per-image inputs (``pixel_values``, ``image_grid_thw``, ``image_sizes`` ...), their
    first dimension over the prompt's images or patches, concatenated over a batch. ``image_hashes``: sha256 of each
    image's PNG bytes (the store keeps each image once by it); ``images``: the PIL images (for the store).
    """

    def __init__(self, ids, sequence: dict, pixels: dict, image_hashes: list[str], images: list | None = None):
        super().__init__(ids)
        self.sequence, self.pixels, self.image_hashes, self.images = sequence, pixels, image_hashes, images or []

    def __reduce__(self):
        return (VisionPrompt, (list(self), self.sequence, self.pixels, self.image_hashes, self.images))

    @classmethod
    def from_processor(cls, encoded: dict[str, Any], images: list) -> VisionPrompt:
        ids = encoded.pop("input_ids")[0].tolist()
        encoded.pop("attention_mask", None)
        encoded.pop("labels", None)  # PaliGemma's processor adds training labels: a target, not a model input
        sequence, pixels = {}, {}
        for key, value in encoded.items():
            if not isinstance(value, torch.Tensor):
                continue
            if value.dim() == 2 and value.size(0) == 1 and value.size(1) == len(ids) and key.endswith("type_ids"):
                sequence[key] = value[0]
            else:
                pixels[key] = value
        return cls(ids, sequence, pixels, [image_hash(i) for i in images], images)


def image_hash(image) -> str:
    """sha256 of the image's PNG bytes (what the store keeps)."""
    return hashlib.sha256(png_bytes(image)).hexdigest()


def png_bytes(image) -> bytes:
    import io

    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def has_images(prompts) -> bool:
    """Whether any of ``prompts`` (token id lists) carries images."""
    return any(isinstance(p, VisionPrompt) for p in prompts)


def keep(prompt) -> list:
    """A copy of a prompt's ids for a Rollouts record: a VisionPrompt stays one (its inputs travel on)."""
    return prompt if isinstance(prompt, VisionPrompt) else list(prompt)


def batch_inputs(prompts: list, width: int, device: torch.device, right: int = 0) -> dict[str, torch.Tensor]:
    """The model's extra inputs for ``prompts`` left-padded to ``width`` tokens (and ``right`` more columns after
    them, completion tokens: 0 there, text). Prompts without images add no pixels."""
    sequence_keys = sorted({k for p in prompts if isinstance(p, VisionPrompt) for k in p.sequence})
    pixel_keys = sorted({k for p in prompts if isinstance(p, VisionPrompt) for k in p.pixels})
    out: dict[str, torch.Tensor] = {}
    for key in sequence_keys:
        rows = torch.zeros((len(prompts), width + right), dtype=torch.long)
        for i, p in enumerate(prompts):
            values = p.sequence.get(key) if isinstance(p, VisionPrompt) else None
            if values is not None:
                rows[i, width - values.numel() : width] = values
        out[key] = rows.to(device)
    for key in pixel_keys:
        parts = [p.pixels[key] for p in prompts if isinstance(p, VisionPrompt) and key in p.pixels]
        out[key] = torch.cat(parts).to(device)
    return out


def prompt_positions(
    model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor, inputs: dict[str, torch.Tensor]
) -> torch.Tensor:
    """Position ids of left-padded prompts [B, P]: the model's multimodal rotary positions [3, B, P] where it has
    them (``get_rope_index``, with images), else the count of real tokens before each one [B, P]."""
    plain = (mask.cumsum(-1) - 1).clamp(min=0)  # [B, P]
    rope_index = _rope_index(model)
    if rope_index is None or "image_grid_thw" not in inputs:
        return plain
    import inspect

    kwargs = {"image_grid_thw": inputs["image_grid_thw"], "attention_mask": mask}
    if "mm_token_type_ids" in inspect.signature(rope_index).parameters:
        types = inputs.get("mm_token_type_ids")
        if types is None:
            types = (ids == _image_token_id(model)).long()
        kwargs["mm_token_type_ids"] = types[:, : ids.size(1)]
    position, _ = rope_index(ids, **kwargs)  # [3, B, P]
    return position


def next_positions(position: torch.Tensor, count: int) -> torch.Tensor:
    """[B, count] positions of the ``count`` text tokens after prompts whose positions are ``position`` ([B, P] or
    [3, B, P]: after an M-RoPE prompt text continues from its largest position + 1 on all three axes)."""
    last = position[..., -1:] if position.dim() == 2 else position[..., -1:].amax(0)  # [B, 1]
    return last + torch.arange(1, count + 1, device=position.device)


def with_positions(prompt: torch.Tensor, after: torch.Tensor) -> torch.Tensor:
    """Prompt positions ([B, P] or [3, B, P]) followed by ``after`` [B, w] (text: the same on every axis)."""
    if prompt.dim() == 3:
        after = after[None].expand(prompt.size(0), -1, -1)
    return torch.cat([prompt, after], dim=-1)


def _rope_index(model: torch.nn.Module):
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    for owner in (base, getattr(base, "model", None)):
        found = getattr(owner, "get_rope_index", None)
        if found is not None:
            return found
    return None


def _image_token_id(model: torch.nn.Module) -> int:
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return int(base.config.image_token_id)


def placeholder_ids(model: torch.nn.Module) -> tuple[int, ...]:
    """The model's image and video placeholder token ids: never sampled into a completion (the model's forward would
    count them as image slots with no image, and the learner could not run the completion)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    config = base.config
    names = ("image_token_id", "video_token_id", "image_token_index", "video_token_index")
    return tuple(sorted({int(v) for v in (getattr(config, n, None) for n in names) if isinstance(v, int)}))


def conversation_inputs(
    model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor, images: list[list[dict]]
) -> dict[str, torch.Tensor]:
    """The inputs of a full forward over whole conversations whose images may lie anywhere (in the prompt, in tool
    messages of the completion): ``ids`` / ``mask`` [R, L] (any padding), ``images``: per row its processor pixel
    inputs in the order of its image placeholders (the prompt's ``VisionPrompt.pixels``, then each tool round's).
    Gives ``input_ids``, ``attention_mask``, the pixel inputs concatenated row by row, the image-token type ids the
    model's forward takes (``mm_token_type_ids`` / ``token_type_ids``: 1 on image placeholders) and the model's own
    positions over the whole sequence (M-RoPE's [3, R, L] from ``get_rope_index``: positions jump after each image)."""
    import inspect

    parts = [p for row in images for p in row if p]
    keys = sorted({k for p in parts for k in p})
    pixels = {k: torch.cat([p[k] for p in parts if k in p]).to(ids.device) for k in keys}
    types = {}
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    params = inspect.signature(base.forward).parameters
    for key in ("mm_token_type_ids", "token_type_ids"):
        if key in params and parts:
            types[key] = (ids == _image_token_id(model)).long() * mask.long()
    position = prompt_positions(model, ids, mask.long(), {**pixels, **types}) if parts else None
    if position is None:
        position = (mask.long().cumsum(-1) - 1).clamp(min=0)
    return {"input_ids": ids, "attention_mask": mask.long(), "position_ids": position, **pixels, **types}
