"""Tools that return images (TRL's multimodal tool response): a bare PIL image, or content parts
``[{"type": "image", "image": <PIL image>}, {"type": "text", "text": "..."}]``. The tool message the model reads
next holds the images as content parts, in the tool's order; the rollout loop renders it through the model's
processor (:class:`grpokit.tools.conversation.ConversationTokens` with a processor), which widens each image's
placeholder to its patches and gives the images' pixel inputs (docs/vision.md, "Tools that return images")."""

from __future__ import annotations

from typing import Any

from grpokit.errors import ConfigError

IMAGE_PARTS = ("image", "image_url", "input_image")


def _is_pil(value: Any) -> bool:
    return type(value).__module__.startswith("PIL.")


def shows_images(value: Any) -> bool:
    """Whether a tool's return value holds images: a PIL image, or content parts (TRL's multimodal tool response,
    ``[{"type": "image", "image": ...}, {"type": "text", ...}]``) with an image among them."""
    parts = value if isinstance(value, (list, tuple)) else [value]
    return any(_is_pil(part) or (isinstance(part, dict) and part.get("type") in IMAGE_PARTS) for part in parts)


def image_parts(value: Any) -> list[dict[str, Any]] | str:
    """Content parts of a return value that :func:`shows_images`: ``{"type": "image", "image": <PIL RGB image>}``
    and ``{"type": "text", "text": ...}`` in the tool's order; or, for a part grpokit cannot show, the reason
    (a string: an image by URL, which grpokit does not download, or one that is not a PIL image)."""
    parts = list(value) if isinstance(value, (list, tuple)) else [value]
    out: list[dict[str, Any]] = []
    for part in parts:
        if _is_pil(part):
            out.append({"type": "image", "image": part.convert("RGB")})
        elif isinstance(part, dict) and part.get("type") == "image" and _is_pil(part.get("image")):
            out.append({"type": "image", "image": part["image"].convert("RGB")})
        elif isinstance(part, dict) and part.get("type") in IMAGE_PARTS:
            return f"its {part.get('type')!r} part holds no PIL image (grpokit downloads nothing)"
        elif isinstance(part, dict) and part.get("type") == "text":
            out.append({"type": "text", "text": str(part.get("text", ""))})
        else:
            out.append({"type": "text", "text": part if isinstance(part, str) else str(part)})
    return out


def parts_text(parts: list[dict[str, Any]]) -> str:
    """The text of content parts (their text parts joined by newlines): a tool message's text for the store."""
    return "\n".join(p["text"] for p in parts if p["type"] == "text")


def images_refused(name: str | None, why: str = "") -> ConfigError:
    """The one line that ends a run whose tool returned an image grpokit cannot show: an image part without a PIL
    image, or a model without an image processor (docs/vision.md, "Tools that return images")."""
    reason = why or "the model has no image processor to show it"
    return ConfigError(
        f"tool {name!r} returned an image, but {reason} (docs/vision.md, 'Tools that return images'): return PIL "
        "images ({'type': 'image', 'image': <PIL image>}) to a vision-language model given with its processor "
        "(processing_class=AutoProcessor...), or return text."
    )
