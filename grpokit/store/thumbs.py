"""A prompt's images in the report: thumbnails of the run's stored files (``RUN/images/<sha256>.png``,
store/images.py), linked by a path relative to the page so the page works from ``file://`` and copies no image, each
titled with its hash and size. The Groups, Held-out prompts, Tokens and best-and-worst views all draw them so."""

from __future__ import annotations

from collections.abc import Iterable

from grpokit.store.html_text import text
from grpokit.store.store import RolloutStore

CHUNK = 500  # hashes per look-up (SQLite allows 999 variables a statement before 3.32, 32,766 since)


def known_images(store: RolloutStore, hash_lists: Iterable[list[str] | None]) -> dict[str, dict]:
    """``RolloutStore.images`` of every hash in ``hash_lists`` (each a rollout's or an evaluated prompt's
    ``images``; None: a text prompt); hashes of the wrong type (a store edited by hand) are left out."""
    hashes = sorted(
        {sha for hashes in hash_lists if isinstance(hashes, list) for sha in hashes if isinstance(sha, str)}
    )
    known: dict[str, dict] = {}
    for start in range(0, len(hashes), CHUNK):  # a query's variables stay under SQLite's limit
        known |= store.images(hashes[start : start + CHUNK])
    return known


def thumbnails(hashes: list[str] | None, known: dict[str, dict], images_url: str) -> str:
    """A prompt's images as thumbnails (``known``: ``RolloutStore.images``), each titled with its sha256 and size; an
    image the store did not keep (log_multimodal false, past store_images_max_mb, or its file gone) as its hash."""
    cells = []
    for n, sha in enumerate(hashes if isinstance(hashes, list) else (), 1):
        row = known.get(sha) if isinstance(sha, str) else None
        size = f", {row['bytes']} bytes, {row['width']}x{row['height']} px" if row else ""
        title = f"image {n}: sha256 {sha}{size}"
        if row is not None and row["path"] is not None and row["path"].is_file():
            src = f"{images_url}/{sha}.png"
            cells.append(f'<img src="{text(src)}" alt="{text(title)}" title="{text(title)}" loading="lazy">')
        else:
            cells.append(f'<span class="at" title="{text(title)}">image {n} not stored ({text(str(sha)[:12])})</span>')
    return f'<div class="thumbs">{"".join(cells)}</div>' if cells else ""
