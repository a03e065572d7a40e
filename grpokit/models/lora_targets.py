"""Which modules a LoRA ``target_modules`` setting names, for code that reasons about it before peft wraps a model.

peft accepts a list (or set) of module names, a string (``"all-linear"`` or a regular expression), or ``None``:
peft then picks the modules for the architecture from its own table (for Llama and Qwen2: ``q_proj`` and
``v_proj``), which is how most LoRA scripts are written.
"""

from __future__ import annotations

from typing import Any

# A string target is "all-linear" or a regular expression over module names: it may name any Linear.
ANY_LINEAR = None


def target_names(target_modules: Any, model_type: str | None) -> frozenset[str] | None:
    """The module names ``target_modules`` adapts on a model of ``model_type``, or None where it may adapt any
    Linear (a string: ``"all-linear"`` or a regular expression; ``None`` on an architecture peft has no default
    for, or without peft)."""
    if isinstance(target_modules, str):
        return ANY_LINEAR
    if target_modules is None:
        try:
            from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as DEFAULTS
        except ImportError:
            return ANY_LINEAR
        defaults = DEFAULTS.get(model_type or "")
        return frozenset(defaults) if defaults else ANY_LINEAR
    return frozenset(str(name) for name in target_modules)


def adapts_any(target_modules: Any, model_type: str | None, names: tuple[str, ...]) -> bool:
    """Whether ``target_modules`` may put an adapter on a module named one of ``names`` (a module name, or a
    dotted path ending in one)."""
    targets = target_names(target_modules, model_type)
    if targets is ANY_LINEAR:
        return True
    return any(t == n or t.endswith("." + n) for t in targets for n in names)
