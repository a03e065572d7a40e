"""Images of a prompt dataset: each row's image (column ``image``) or images (``images``) read as PIL images (from
PIL images, arrays, file paths or ``datasets.Image`` values; URLs are refused: nothing is downloaded), placed in the
prompt's chat messages, and encoded with the processor into the prompt's token ids and pixel inputs
(:class:`grpokit.models.vision_inputs.VisionPrompt`)."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from grpokit.data.sources import DataError

DEFAULT_COLUMNS = ("images", "image")


def image_column(rows: list[dict], configured: str | None) -> str | None:
    """The column that holds the rows' images: ``configured``, else ``images`` or ``image`` if a row has it."""
    if configured is not None:
        if not any(configured in row for row in rows):
            raise DataError(f"image_column {configured!r}: no row has this column; set it to the images' column.")
        return configured
    return next((c for c in DEFAULT_COLUMNS if any(c in row for row in rows)), None)


def row_images(row: dict, column: str | None, where: str) -> list:
    """The row's images as PIL RGB images (none: [])."""
    if column is None or row.get(column) is None:
        return []
    value = row[column]
    values = list(value) if isinstance(value, (list, tuple)) else [value]
    return [to_pil(v, where) for v in values]


def to_pil(value: Any, where: str):
    """A PIL RGB image from a PIL image, a numpy array or tensor [H, W(, C)] (uint8, or floats in [0, 1]), a file
    path, or a ``datasets.Image`` value ({"bytes", "path"})."""
    import numpy as np
    from PIL import Image

    if isinstance(value, Image.Image):
        return value.convert("RGB")
    if isinstance(value, dict) and ("bytes" in value or "path" in value):
        if value.get("bytes") is not None:
            return Image.open(io.BytesIO(value["bytes"])).convert("RGB")
        value = value.get("path")
    if isinstance(value, (str, Path)):
        text = str(value)
        if text.startswith(("http://", "https://")):
            raise DataError(
                f"{where}: the image {text!r} is a URL; grpokit reads no images from the network: download it and give "
                "its file path (or the image itself)."
            )
        if not Path(text).is_file():
            raise DataError(f"{where}: the image file {text!r} does not exist.")
        with Image.open(text) as image:
            return image.convert("RGB")
    if hasattr(value, "numpy"):
        value = value.detach().cpu().numpy()
    if isinstance(value, np.ndarray):
        array = value
        if array.dtype != np.uint8:
            array = (np.clip(array, 0.0, 1.0) * 255).round().astype(np.uint8)
        return Image.fromarray(array).convert("RGB")
    raise DataError(
        f"{where}: an image is a {type(value).__name__}; give a PIL image, an array, a file path or a datasets.Image."
    )


def with_image_entries(prompt: str | list, count: int) -> list[dict]:
    """Chat messages in which the prompt's ``count`` images have their ``{"type": "image"}`` entries: a plain-text
    prompt becomes one user message (images, then the text); messages with no image entry get them at the start of
    the first user message (TRL's placement); messages that have them stay as they are."""
    if isinstance(prompt, str):
        return [
            {"role": "user", "content": [*({"type": "image"} for _ in range(count)), {"type": "text", "text": prompt}]}
        ]
    placed = sum(
        1 for m in prompt if isinstance(m.get("content"), list) for c in m["content"] if c.get("type") == "image"
    )
    if placed:
        if placed != count:
            raise DataError(f"the prompt has {placed} image entries but its row has {count} images; make them match.")
        return prompt
    out, done = [], False
    for message in prompt:
        if not done and message.get("role") == "user":
            content = message["content"]
            text = [{"type": "text", "text": content}] if isinstance(content, str) else list(content)
            message = {**message, "content": [*({"type": "image"} for _ in range(count)), *text]}
            done = True
        out.append(message)
    if not done:
        raise DataError("a prompt with images has no user message to hold them; add one.")
    return out


def encode(processor, prompt: str | list, images: list, template_kwargs: dict | None = None):
    """(text, VisionPrompt) of a prompt with ``images`` through the processor's chat template and the processor."""
    from grpokit.models.vision_inputs import VisionPrompt

    messages = with_image_entries(prompt, len(images))
    template = getattr(processor, "chat_template", None) or getattr(processor.tokenizer, "chat_template", None)
    if not template:
        raise DataError(
            "prompts with images need a chat template to place them; the processor and tokenizer have none."
        )
    text = processor.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True, chat_template=template, **(template_kwargs or {})
    )
    # as transformers' processor.apply_chat_template(tokenize=True) (TRL's encoding): the tokenizer's special tokens
    # (LLaVA-NeXT's BOS) unless the template already wrote the BOS (Gemma 3's)
    bos = getattr(processor.tokenizer, "bos_token", None)
    add_special = not (bos is not None and text.startswith(bos))
    encoded = processor(text=[text], images=images, return_tensors="pt", add_special_tokens=add_special)
    return text, VisionPrompt.from_processor(dict(encoded), images)


class ImagePrompts:
    """Encodes the rows of a dataset whose prompts have images, through the run's processor; rows without images
    are left to the tokenizer. Each row's image column is replaced by its PIL image(s), as reward functions get it."""

    def __init__(self, processor, column: str, template_kwargs: dict | None):
        self.processor, self.column, self.template_kwargs = processor, column, template_kwargs

    @classmethod
    def for_rows(cls, rows: list[dict], tokenizer, configured: str | None, template_kwargs: dict | None):
        """An encoder for ``rows``, or None when no row has an image. One error line when rows have images but the
        model came with no processor."""
        from grpokit.models.vision import processor_of

        column = image_column(rows, configured)
        if column is None or all(row.get(column) is None for row in rows):
            return None
        processor = processor_of(tokenizer)
        if processor is None:
            raise DataError(
                f"the dataset's {column!r} column holds images but the model has no image processor: train a "
                "vision-language model (with its processor: processing_class=AutoProcessor...), or drop the column."
            )
        return cls(processor, column, template_kwargs)

    def encode(self, row: dict, prompt, where: str):
        """(text, VisionPrompt) of a row with images, or None for a row without."""
        images = row_images(row, self.column, where)
        if not images:
            return None
        value = row[self.column]
        row[self.column] = images if isinstance(value, (list, tuple)) else images[0]
        return encode(self.processor, prompt, images, self.template_kwargs)
