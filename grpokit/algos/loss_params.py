"""The built-in losses' own parameters (their settings classes): keys of the ``algo`` section, which is assembled
from them. Apart from the loss modules, which register their losses when imported, so that the config can read
these without registering anything."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class SapoParams:
    """sapo's own parameters: the soft gate's temperature for tokens with A > 0 and with A <= 0."""

    sapo_temperature_pos: float = 1.0
    """sapo: temperature of the soft gate for tokens with a positive advantage."""
    sapo_temperature_neg: float = 1.05
    """sapo: temperature of the soft gate for tokens with a non-positive advantage."""


@dataclass
class VespoParams:
    """vespo's own parameters: the kernel w^k exp(lambda (1 - w))'s power k and decay lambda, for A >= 0 and A < 0."""

    vespo_k_pos: float = 2.0
    """vespo: power k of the kernel w^k exp(lambda (1 - w)) on the sequence importance weight w, for A >= 0."""
    vespo_lambda_pos: float = 3.0
    """vespo: decay lambda of the kernel, for A >= 0."""
    vespo_k_neg: float = 3.0
    """vespo: power k of the kernel, for A < 0."""
    vespo_lambda_neg: float = 2.0
    """vespo: decay lambda of the kernel, for A < 0."""
