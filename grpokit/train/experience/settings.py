"""Dynamic sampling's settings (:mod:`grpokit.train.experience.rounds`): keys of the ``algo`` section, which is
assembled from this class; torch-free."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class DynamicSamplingSettings:
    """DAPO's dynamic sampling."""

    dynamic_sampling: bool = False
    """DAPO dynamic sampling: drop groups whose rewards all tie, sample more prompts until the step's batch is full."""
    max_sampling_rounds: int = 10
    """Cap on dynamic sampling's rounds per step (the first included); at the cap the step trains on what it found."""
