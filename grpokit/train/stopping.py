"""Stopping a run that has gone wrong: ``max_nonfinite_steps`` steps in a row with a non-finite loss or
gradient (their updates were skipped), or a mean KL above ``max_kl`` for ``max_kl_patience`` steps in a row."""

from __future__ import annotations


class StopRules:
    """``check(metrics)`` after each step: the reason to stop, or None. ``counters`` (consecutive bad steps) go
    into checkpoints, so a resumed run counts on."""

    def __init__(self, args):
        self.args = args
        self.counters = {"kl_over": 0, "nonfinite": 0}

    def check(self, metrics: dict) -> str | None:
        args, counters, reason = self.args, self.counters, None
        counters["nonfinite"] = counters["nonfinite"] + 1 if metrics.get("nonfinite") else 0
        if counters["nonfinite"] >= args.max_nonfinite_steps:
            reason = (
                f"{args.max_nonfinite_steps} steps in a row had a non-finite loss or gradient (updates skipped); "
                "lower learning_rate, check the reward functions for inf/NaN, or raise max_nonfinite_steps."
            )
        if args.max_kl is not None and metrics.get("kl", 0.0) > args.max_kl:
            counters["kl_over"] += 1
            if counters["kl_over"] >= args.max_kl_patience:
                reason = (
                    f"mean KL {metrics['kl']:.4f} exceeded max_kl={args.max_kl} for {args.max_kl_patience} step(s)."
                )
        else:
            counters["kl_over"] = 0
        return reason
