"""The ``lora`` section: LoRA adapters' settings (peft's LoraConfig is built from them in models/loading.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from grpokit.errors import require


@dataclass
class LoraSettings:
    r: int = 0
    """LoRA rank; 0 = full fine-tuning."""
    alpha: int = 16
    """LoRA scaling alpha."""
    dropout: float = 0.0
    """LoRA dropout."""
    target_modules: Any = "all-linear"
    """Module names (list), all-linear, or null (peft's default for the architecture: q_proj, v_proj on Llama)."""
    merge_on_save: bool = False
    """Also save merged full weights at the end."""

    def check(self) -> None:
        require(self.r >= 0, f"lora.r={self.r} must be >= 0 (0 = no LoRA).")
        require(self.alpha > 0, f"lora.alpha={self.alpha} must be > 0.")
        require(0 <= self.dropout < 1, f"lora.dropout={self.dropout} must be in [0, 1).")
