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


def for_workers(prompt):
    """What a prompt sends to a Ray rollout worker: a VisionPrompt without its PIL images (the driver's copy keeps
    them for the store; the worker samples from the ids and the processor's inputs), any other prompt as it is."""
    if not isinstance(prompt, VisionPrompt) or not prompt.images:
        return prompt
    return VisionPrompt(list(prompt), prompt.sequence, prompt.pixels, prompt.image_hashes)


def ids_only(prompts: list) -> list:
    """The prompts' token ids as plain lists: what a Ray worker's rollouts send back (the driver puts its own
    VisionPrompts back in: :func:`with_driver_prompts`), so no pixel tensor travels twice."""
    return [list(p) if isinstance(p, VisionPrompt) else p for p in prompts]


def with_driver_prompts(returned: list, sent: list) -> list:
    """``sent`` (the driver's prompts, images and all) in place of ``returned`` (a worker's rollouts' prompt ids,
    one per group in the order sent); a prompt whose ids differ stops the run instead of pairing the wrong images."""
    if len(returned) != len(sent) or any(list(r) != list(s) for r, s in zip(returned, sent)):
        raise RuntimeError("a rollout worker returned other prompts than it was sent; their images cannot be paired")
    return [keep(s) for s in sent]


def has_images(prompts) -> bool:
    """Whether any of ``prompts`` (token id lists) carries images."""
    return any(isinstance(p, VisionPrompt) for p in prompts)


def keep(prompt) -> list:
    """A copy of a prompt's ids for a Rollouts record: a VisionPrompt stays one (its inputs travel on)."""
    return prompt if isinstance(prompt, VisionPrompt) else list(prompt)


def plain(prompts: list) -> list[list[int]]:
    """Prompt ids as plain lists (a checkpoint holds tensors and lists only; the pixel inputs are the dataset's)."""
    return [list(p) for p in prompts]


def reattach(saved: list[list[int]], fresh: list) -> list | None:
    """A checkpoint's prompt ids (``plain``) given back the pixel inputs of the same prompts as the resumed run
    encoded them from its dataset (``fresh``, in the same order): each VisionPrompt of ``fresh`` replaces its ids. A
    text prompt stays as saved; None when a prompt with images no longer encodes to the saved ids."""
    if not has_images(fresh):
        return saved
    if len(saved) != len(fresh) or any(list(a) != list(b) for a, b in zip(saved, fresh)):
        return None
    return [f if isinstance(f, VisionPrompt) else list(s) for s, f in zip(saved, fresh)]


# families whose forward counts positions from 1 (PaliGemma's forward and its generate add 1): model_type -> offset
POSITION_OFFSET = {"paligemma": 1}
# families whose completion tokens carry a per-token type other than text's 0: PaliGemma's prompt is a bidirectional
# prefix (token_type_ids 0) and its completion a causal suffix (1), as its processor's ``suffix=`` and generate make it
COMPLETION_TYPES = {"paligemma": {"token_type_ids": 1}}


def _model_type(model: torch.nn.Module) -> str | None:
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return getattr(getattr(getattr(base, "module", base), "config", None), "model_type", None)


def position_offset(model: torch.nn.Module) -> int:
    """The position of a sequence's first token: 1 for families counting from 1 (POSITION_OFFSET), else 0."""
    return POSITION_OFFSET.get(_model_type(model), 0)


def completion_types(model: torch.nn.Module) -> dict[str, int]:
    """The values of per-token inputs (``token_type_ids`` ...) at completion tokens, where they are not 0."""
    return COMPLETION_TYPES.get(_model_type(model), {})


def batch_inputs(
    prompts: list, width: int, device: torch.device, right: int = 0, completion: dict[str, int] | None = None
) -> dict[str, torch.Tensor]:
    """The model's extra inputs for ``prompts`` left-padded to ``width`` tokens (and ``right`` more columns after
    them, completion tokens: ``completion[key]`` there, else 0, text). Prompts without images add no pixels."""
    sequence_keys = sorted({k for p in prompts if isinstance(p, VisionPrompt) for k in p.sequence})
    pixel_keys = sorted({k for p in prompts if isinstance(p, VisionPrompt) for k in p.pixels})
    out: dict[str, torch.Tensor] = {}
    for key in sequence_keys:
        rows = torch.zeros((len(prompts), width + right), dtype=torch.long)
        rows[:, width:] = (completion or {}).get(key, 0)
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
    them (``get_rope_index``, with images), else the count of real tokens before each one [B, P] (plus 1 where the
    family counts from 1: POSITION_OFFSET)."""
    plain = (mask.cumsum(-1) - 1).clamp(min=0) + position_offset(model)  # [B, P]
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
