"""Stopping a run that has gone wrong: ``max_nonfinite_steps`` steps in a row with a non-finite loss or
gradient (their updates were skipped), or a mean KL above ``max_kl`` for ``max_kl_patience`` steps in a row."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StopSpec:
    """The stop rules' settings: ``max_nonfinite_steps``; ``max_kl`` (None: no KL rule) and ``max_kl_patience``."""

    max_nonfinite_steps: int
    max_kl: float | None
    max_kl_patience: int


class StopRules:
    """``check(metrics)`` after each step: the reason to stop, or None. ``counters`` (consecutive bad steps) go
    into checkpoints, so a resumed run counts on."""

    def __init__(self, spec: StopSpec):
        self.spec = spec
        self.counters = {"kl_over": 0, "nonfinite": 0}

    def check(self, metrics: dict) -> str | None:
        spec, counters, reason = self.spec, self.counters, None
        counters["nonfinite"] = counters["nonfinite"] + 1 if metrics.get("nonfinite") else 0
        if counters["nonfinite"] >= spec.max_nonfinite_steps:
            reason = (
                f"{spec.max_nonfinite_steps} steps in a row had a non-finite loss or gradient (updates skipped); "
                "lower learning_rate, check the reward functions for inf/NaN, or raise max_nonfinite_steps."
            )
        if spec.max_kl is not None and metrics.get("kl", 0.0) > spec.max_kl:
            counters["kl_over"] += 1
            if counters["kl_over"] >= spec.max_kl_patience:
                reason = (
                    f"mean KL {metrics['kl']:.4f} exceeded max_kl={spec.max_kl} for {spec.max_kl_patience} step(s)."
                )
        else:
            counters["kl_over"] = 0
        return reason
