"""The data section's image settings (grpokit.data.images reads them)."""

from __future__ import annotations

from dataclasses import dataclass

from grpokit.errors import ConfigError


@dataclass
class ImageDataSettings:
    image_column: str | None = None
    """Vision-language models: the column holding each prompt's images (a list) or image (one); null = images, else
    image, whichever the dataset has (TRL's names; verl's data.image_key)."""

    def check(self) -> None:
        if self.image_column is not None and (not isinstance(self.image_column, str) or not self.image_column):
            raise ConfigError(f"image_column={self.image_column!r} must be a column name or null.")
