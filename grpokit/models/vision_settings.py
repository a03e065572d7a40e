"""The model section's vision-language settings (grpokit.models.vision applies them after loading)."""

from __future__ import annotations

from dataclasses import dataclass

from grpokit.errors import ConfigError


@dataclass
class VisionModelSettings:
    freeze_vision_tower: bool = False
    """Vision-language models: the vision encoder does not train (verl's name; its projector is freeze_projector)."""
    freeze_projector: bool = False
    """Vision-language models: the projector from the vision tower to the language model does not train."""

    def check(self) -> None:
        for name in ("freeze_vision_tower", "freeze_projector"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name} must be true or false, got {getattr(self, name)!r}.")
