"""The optimizer's settings (:func:`grpokit.train.learning.optimizer.make_optimizer`): which AdamW, its
hyper-parameters and its learning-rate schedule. Keys of the ``optim`` section, which is assembled from this class;
torch-free, so the config reads it without loading torch.

A new optimizer key is one field here (its default, type and doc line), its check in :meth:`check`, and its place in
:meth:`hyper` (the optimizer's keyword arguments): the config, YAML, ``key=value`` and TRL's ``GRPOConfig`` find it
from the field (tests/integration/test_extension_points.py adds one this way).
"""

from __future__ import annotations

from dataclasses import dataclass

from grpokit.errors import ConfigError

# transformers' names (TrainingArguments' ``optim``): torch's AdamW, and bitsandbytes' AdamW8bit (both of its names)
OPTIMIZERS = ("adamw_torch_fused", "adamw_torch", "adamw_bnb_8bit", "adamw_8bit")
EIGHT_BIT_OPTIMIZERS = ("adamw_bnb_8bit", "adamw_8bit")
LR_SCHEDULES = ("constant", "linear", "cosine")


@dataclass
class OptimizerSettings:
    """AdamW and its schedule; TRL's names and defaults."""

    learning_rate: float = 1e-6
    """AdamW peak learning rate."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    adam_beta1: float = 0.9
    """AdamW beta1."""
    adam_beta2: float = 0.999
    """AdamW beta2."""
    adam_epsilon: float = 1e-8
    """AdamW epsilon."""
    optimizer: str = "adamw_torch_fused"
    """adamw_torch_fused = adamw_torch (torch's AdamW, fused on CPU and CUDA) | adamw_bnb_8bit = adamw_8bit
    (bitsandbytes' AdamW8bit, CPU or CUDA, the qlora extra: both moments in 8 bits, a quarter of AdamW's state; its
    updates differ by the moments' quantisation). TRL's `optim` sets it."""
    lr_scheduler_type: str = "linear"
    """constant | linear | cosine (after warmup)."""
    warmup_ratio: float = 0.0
    """Fraction of max_steps used for linear warmup."""
    warmup_steps: int = 0
    """Warmup steps (overrides warmup_ratio when > 0)."""

    def check(self) -> None:
        """A ConfigError naming the value and the fix for each impossible setting."""
        for name, ok, rule in (
            ("learning_rate", self.learning_rate >= 0, "must be >= 0"),
            ("weight_decay", self.weight_decay >= 0, "must be >= 0"),
            ("adam_beta1", 0 <= self.adam_beta1 < 1, "must be in [0, 1) (AdamW's moving-average rate, e.g. 0.9)"),
            ("adam_beta2", 0 <= self.adam_beta2 < 1, "must be in [0, 1) (AdamW's moving-average rate, e.g. 0.999)"),
            ("adam_epsilon", self.adam_epsilon > 0, "must be > 0"),
            ("warmup_ratio", 0 <= self.warmup_ratio < 1, "must be in [0, 1)"),
            ("warmup_steps", self.warmup_steps >= 0, "must be >= 0"),
        ):
            if not ok:
                raise ConfigError(f"{name}={getattr(self, name)} {rule}.")

    @property
    def eight_bit(self) -> bool:
        """bitsandbytes' AdamW8bit (the qlora extra), not torch's AdamW."""
        return self.optimizer in EIGHT_BIT_OPTIMIZERS

    def hyper(self, learning_rate: float | None = None) -> dict:
        """The optimizer's keyword arguments; ``learning_rate`` for a second optimizer (PPO's critic)."""
        lr = self.learning_rate if learning_rate is None else learning_rate
        return dict(
            lr=lr, betas=(self.adam_beta1, self.adam_beta2), eps=self.adam_epsilon, weight_decay=self.weight_decay
        )

    def warmup(self, total_steps: int) -> int:
        """Warmup optimizer steps of a schedule over ``total_steps``: ``warmup_steps``, else the ratio's share."""
        return self.warmup_steps or int(self.warmup_ratio * total_steps)
