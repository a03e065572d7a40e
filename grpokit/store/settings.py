"""The rollout store's settings: what it keeps beyond every rollout. Keys of the ``run`` section, which is assembled
from this class; torch-free, so the config reads it without loading torch."""

from __future__ import annotations

from dataclasses import dataclass, field

from grpokit.errors import ConfigError
from grpokit.store.token_values import TOKEN_VALUES


@dataclass
class StoreSettings:
    """What rollouts.sqlite keeps beside every rollout (grpokit/store/token_values.py)."""

    store_token_values: list = field(default_factory=list)
    """Per-token values to keep for every completion trained on (the report's Tokens view): any of logprob (the
    learner's), gap (learner minus sampler log-prob), entropy, weight (the token's weight in the policy loss: 0 where
    clipped or masked), or [all]; [] = none. Costs 2 bytes a token and value plus the tokens' text (docs/runs.md)."""
    log_multimodal: bool = True
    """Vision-language models: keep each distinct image the prompts showed, once, as RUN/images/<sha256>.png (TRL's
    name; false: none is kept, the rollouts still name their images' hashes)."""
    store_images_max_mb: float | None = 1024.0
    """The most megabytes (10^6 bytes) of image files a run keeps; an image past it is listed, not written. null: no
    cap."""

    def check(self) -> None:
        if not isinstance(self.log_multimodal, bool):
            raise ConfigError(f"log_multimodal={self.log_multimodal!r} must be true or false.")
        cap = self.store_images_max_mb
        if cap is not None and (isinstance(cap, bool) or not isinstance(cap, (int, float)) or not cap >= 0):
            raise ConfigError(f"store_images_max_mb={cap!r} must be a number of megabytes >= 0, or null for no cap.")
        values = self.store_token_values
        if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
            raise ConfigError(
                f"store_token_values={values!r} must be a list of names, e.g. [logprob, gap, entropy, weight] or [all]."
            )
        for name in values:
            if name != "all" and name not in TOKEN_VALUES:
                raise ConfigError(
                    f"store_token_values contains {name!r}; valid values are {', '.join(TOKEN_VALUES)} or all."
                )

    def max_image_bytes(self) -> int | None:
        """``store_images_max_mb`` in bytes (None: no cap)."""
        return None if self.store_images_max_mb is None else int(self.store_images_max_mb * 1_000_000)

    def kept_token_values(self) -> tuple[str, ...]:
        """The values to keep, in the store's order (``all``: every one)."""
        wanted = set(self.store_token_values)
        return tuple(name for name in TOKEN_VALUES if name in wanted or "all" in wanted)
