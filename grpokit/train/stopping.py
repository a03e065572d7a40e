"""Stopping a run that has gone wrong: ``max_nonfinite_steps`` steps in a row with a non-finite loss or
gradient (their updates were skipped), or a mean KL above ``max_kl`` for ``max_kl_patience`` steps in a row."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from grpokit.algos.settings import KLControlSettings
    from grpokit.train.loop_settings import StopSettings


class StopRules:
    """``check(metrics)`` after each step: the reason to stop, or None. ``counters`` (consecutive bad steps) go
    into checkpoints, so a resumed run counts on. ``stop``: ``max_nonfinite_steps``; ``kl``: ``max_kl`` (None: no KL
    rule) and ``max_kl_patience``."""

    def __init__(self, stop: StopSettings, kl: KLControlSettings):
        self.stop, self.kl = stop, kl
        self.counters = {"kl_over": 0, "nonfinite": 0}

    def check(self, metrics: dict) -> str | None:
        stop, kl, counters, reason = self.stop, self.kl, self.counters, None
        counters["nonfinite"] = counters["nonfinite"] + 1 if metrics.get("nonfinite") else 0
        if counters["nonfinite"] >= stop.max_nonfinite_steps:
            reason = (
                f"{stop.max_nonfinite_steps} steps in a row had a non-finite loss or gradient (updates skipped); "
                "lower learning_rate, check the reward functions for inf/NaN, or raise max_nonfinite_steps."
            )
        if kl.max_kl is not None and metrics.get("kl", 0.0) > kl.max_kl:
            counters["kl_over"] += 1
            if counters["kl_over"] >= kl.max_kl_patience:
                reason = f"mean KL {metrics['kl']:.4f} exceeded max_kl={kl.max_kl} for {kl.max_kl_patience} step(s)."
        else:
            counters["kl_over"] = 0
        return reason
