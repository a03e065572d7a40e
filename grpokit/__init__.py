"""grpokit: GRPO-family reinforcement learning for language models."""

from grpokit.version import __version__

__all__ = ["GRPOConfig", "GRPOTrainer", "__version__", "load_config"]


def __getattr__(name: str):
    # Lazy, so `import grpokit` stays light and the CLI starts fast.
    if name == "GRPOTrainer":
        from grpokit.trl.trainer import GRPOTrainer

        return GRPOTrainer
    if name in ("GRPOConfig", "load_config"):
        from grpokit import config

        return getattr(config, name)
    raise AttributeError(f"module 'grpokit' has no attribute {name!r}")
