"""The completions table ``log_completions`` sends to W&B and trackio (TRL's ``completions`` table): a row per
completion of the step with its step, prompt, completion, each reward function's value, each ``log_extra`` column,
its advantage, and with ``log_multimodal`` its prompt's images (as the tracker's ``Image``) when the step has any:
trackio gets them as TRL logs them, a list per cell of an ``image`` column (trackio stores each as a PNG); W&B one
``wandb.Image`` per cell in ``image``, ``image_2`` ... (a Media object per cell is the cell type W&B documents for a
Table; TRL passes a list). Built only on the ``log_completions`` path, from the records already on the host. The
console's table shows each image as ``[image <first 6 hex of its sha256> <width>x<height>]`` where the prompt's text
holds its placeholder (:func:`console_prompt`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

TABLE_KEY = "completions"  # the key TRL logs the table under
# An image's place in a chat template's text, by model family: Qwen2/2.5-VL, Gemma 3, Llama 3.2 Vision, Pixtral and
# LLaVA-style (<image>); the first whose matches are as many as the prompt's images is used.
IMAGE_PLACEHOLDERS = tuple(
    re.compile(p)
    for p in (
        r"<\|vision_start\|>(?:<\|image_pad\|>)*<\|vision_end\|>",
        r"(?:<\|image_pad\|>)+",
        r"<start_of_image>",
        r"<\|image\|>",
        r"\[IMG\]",
        r"<image>",
    )
)


def image_tag(sha256: str, image: Any | None) -> str:
    """``[image 3f2a9c 28x28]``: an image's hash prefix and size in pixels (``image`` None: the hash alone)."""
    size = f" {image.width}x{image.height}" if image is not None else ""
    return f"[image {sha256[:6]}{size}]"


def console_prompt(record: Any) -> str:
    """A record's prompt for the console, each image's :func:`image_tag` in place of its placeholder (in the
    prompt's order); the tags before the text when the text's placeholders are not one per image."""
    hashes = list(record.images or ())
    if not hashes:
        return record.prompt
    sources = list(record.image_sources or ())
    tags = [image_tag(sha, sources[k] if k < len(sources) else None) for k, sha in enumerate(hashes)]
    for pattern in IMAGE_PLACEHOLDERS:
        pieces = pattern.split(record.prompt)  # no groups: the text around each placeholder
        if len(pieces) == len(tags) + 1:
            return "".join(piece + tag for piece, tag in zip(pieces, [*tags, ""]))
    return " ".join(tags) + " " + record.prompt


def completion_table(records: Sequence[Any], step: int, images: bool) -> tuple[list[str], list[list]]:
    """(columns, rows) of ``records`` (``store.record.RolloutRecord``) at ``step``; ``images``: log_multimodal (an
    ``image`` column, last, of each row's prompt images as PIL, only when some record has images)."""
    names = list(dict.fromkeys(name for r in records for name in r.rewards))
    extras = sorted({column for r in records for column in r.extra or {}})
    with_images = images and any(r.image_sources for r in records)
    columns = ["step", "prompt", "completion", *names, *extras, "advantage", *(["image"] if with_images else [])]
    rows = []
    for r in records:
        extra = r.extra or {}
        row = [step, r.prompt, r.completion, *(r.rewards.get(n) for n in names), *(extra.get(c) for c in extras)]
        row.append(r.advantage)
        if with_images:
            row.append(list(r.image_sources or []))
        rows.append(row)
    return columns, rows


def tracker_table(module: Any, columns: list[str], rows: list[list], image_lists: bool = True) -> Any:
    """``module.Table`` (``wandb`` or ``trackio``: the same signature) of ``columns`` and ``rows``, an ``image``
    column's PIL images each as ``module.Image``: a list of them per cell (``image_lists``: trackio, as TRL), or one
    per cell in ``image``, ``image_2`` ... (None past a prompt's last image; W&B)."""
    if columns and columns[-1] == "image":
        wrapped = [[module.Image(image) for image in row[-1]] for row in rows]
        if image_lists:
            rows = [[*row[:-1], cell] for row, cell in zip(rows, wrapped, strict=True)]
        else:
            most = max([1, *(len(cell) for cell in wrapped)])
            columns = [*columns, *(f"image_{k}" for k in range(2, most + 1))]
            rows = [[*row[:-1], *cell, *[None] * (most - len(cell))] for row, cell in zip(rows, wrapped, strict=True)]
    return module.Table(columns=columns, data=rows, allow_mixed_types=True)
