"""The built-in rewards by name (``rewards: [accuracy, {name: format, ...}]``): each reward class registers itself
with ``@BUILTINS.register("name")`` in its own module; :mod:`grpokit.rewards.resolve` imports those modules."""

from __future__ import annotations

from grpokit.system.registry import Registry

BUILTINS = Registry("reward")
