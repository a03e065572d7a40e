"""The built-in demo: a warm-started tiny model learns arithmetic with GRPO on a CPU."""

from grpokit.demo.run import run_demo
from grpokit.demo.warmstart import WarmStartConfig, ensure_demo_policy

__all__ = ["WarmStartConfig", "ensure_demo_policy", "run_demo"]
