"""Reward functions of the fault tests (loaded by file path, in the trainer's reward worker)."""

import os
import time
from pathlib import Path


def gated(prompts, completions, target, **columns):
    """The fraction of a completion's words that are ``target``; with GRPOKIT_FAULT_GATE=DIR set, its first call
    writes DIR/ready and waits (up to five minutes) for DIR/open: the run is held inside step 1, its run folder
    locked, while the test acts."""
    gate = os.environ.get("GRPOKIT_FAULT_GATE")
    if gate and not (Path(gate) / "open").exists():
        (Path(gate) / "ready").touch()
        deadline = time.monotonic() + 300
        while not (Path(gate) / "open").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
    return [c.split().count(t) / max(1, len(c.split())) for c, t in zip(completions, target)]


def wrong_length(prompts, completions, **columns):
    """Breaks the reward contract (one value for the whole batch): the run stops at step 1 (RewardError)."""
    return [0.0]
