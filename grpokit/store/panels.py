"""The report's charts: every logged metric placed on a panel of its family, one kind of number per panel.

A metric goes to the first family whose patterns match it (``*`` stands for any non-empty text); an evaluation
metric (``eval/<name>``) goes to the same family as ``<name>``, on a panel titled "Eval: ...". Metrics no family
names are grouped by their first path component, so a reward's ``log_metric`` values still get a panel of their own.
A panel holds at most :data:`MAX_SERIES` lines (more are split over numbered panels); a family whose lines are all
0 where 0 means "nothing happened" (no clipping, no reward errors) is left out; counts (``num_*``) are never plotted.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from grpokit.store.directions import matches
from grpokit.store.summary import eval_label, is_count
from grpokit.store.svg import Series

MAX_SERIES = 6


@dataclass(frozen=True)
class Family:
    title: str
    patterns: tuple[str, ...]
    zero_is_empty: bool = False  # all-zero lines show nothing (no clipping): the panel is left out


# Evaluation-only families come first; then the families of training metrics, in the order the page shows them.
EVAL_FAMILIES = (
    Family("Eval: pass@k and greedy accuracy (fraction of prompts)", ("eval/pass@*", "eval/greedy_accuracy")),
    Family("Eval: mean reward", ("eval/reward",)),
)
FAMILIES = (
    Family("Reward", ("reward", "rewards/*/mean")),
    Family("Reward spread (standard deviation)", ("reward_std", "rewards/*/std")),
    Family("Reward errors (completions per step)", ("rewards/*/errors",), zero_is_empty=True),
    Family("Reward null fraction", ("rewards/*/null_fraction",), zero_is_empty=True),
    Family("Reward latency (s): scoring time per step", ("rewards/*/seconds", "time/reward")),
    Family("Groups: zero reward variance, all correct, all wrong (fraction)", ("frac_reward_zero_std", "groups/*")),
    Family("Advantage", ("advantage/*",)),
    Family("Loss and its terms", ("loss", "policy_loss", "kl_penalty", "value_loss", "critic/loss")),
    Family("Gradient norm", ("grad_norm", "critic/grad_norm")),
    Family("KL to the reference", ("kl",), zero_is_empty=True),
    Family("KL coefficient (beta)", ("beta",)),
    Family("Entropy", ("entropy",)),
    Family("Completion log-prob (mean per token)", ("completion_logprob_mean",)),
    Family("Clipped fraction by region", ("clip_ratio/*", "cispo_clip_ratio"), zero_is_empty=True),
    Family("Importance ratio (mean)", ("ratio_mean",)),
    Family("Completion length (tokens)", ("completion_length/*",)),
    Family("Truncated completions (fraction)", ("truncated_fraction",)),
    Family("Prompts truncated or dropped (so far)", ("prompts_truncated", "prompts_dropped"), zero_is_empty=True),
    Family("Tokens per second", ("tokens_per_second",)),
    Family("Phase times (s): sampling, scoring, learning, syncing", ("step_time", "time/*")),
    Family("Memory (GiB)", ("memory/*", "*_memory_gib")),
    Family("Learning rate", ("learning_rate", "critic/learning_rate")),
    Family("Staleness (updates between sampling and training)", ("policy_staleness", "policy_staleness_token_mean")),
    Family("Waiting per step (s): learner for data, producer on the staleness bound", ("async/*_wait_s",)),
    Family("Behaviour importance weights", ("sampling_is/weight_*",)),
    Family("Behaviour weights clipped or masked (fraction of tokens)", ("sampling_is/*_fraction",), zero_is_empty=True),
    Family("Sampler-learner log-prob gap (mean |difference|)", ("sampling_is/logprob_abs_diff",)),
    Family("Dynamic sampling", ("dynamic_sampling/*",)),
    Family("Non-finite steps skipped", ("nonfinite",), zero_is_empty=True),
    Family("Tokens seen", ("num_tokens",)),
)


def _numeric(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def collect_series(metrics: list[dict], evals: list[dict]) -> tuple[dict[str, Series], dict[str, str]]:
    """({label: sorted (step, value) points}, {label: the metric's name as logged}).

    Eval values come from the store's evals, or from the metric rows' eval/ names when it has none (metrics.jsonl
    holds both, under the same names); another dataset than "eval" is labelled after it (:func:`eval_label`)."""
    series: dict[str, Series] = {}
    kinds: dict[str, str] = {}
    for row in metrics:
        for name, value in row.items():
            if name != "step" and _numeric(value) and not (evals and name.startswith("eval/")):
                series.setdefault(name, []).append((row["step"], value))
                kinds[name] = name
    for row in evals:
        for name, value in row.items():
            if name not in ("step", "dataset") and _numeric(value):
                label = eval_label(name, row["dataset"])
                series.setdefault(label, []).append((row["step"], value))
                kinds[label] = name if name.startswith("eval/") else f"eval/{name}"
    return {name: sorted(points) for name, points in series.items()}, kinds


def panels(series: dict[str, Series], kinds: dict[str, str]) -> dict[str, dict[str, Series]]:
    """{panel title: {label: points}}: each label on the panel of its family (module docstring), in the families'
    order, evaluation panels first; at most :data:`MAX_SERIES` labels per panel."""
    placed: dict[str, dict[str, Series]] = {}
    families: dict[str, Family] = {}
    found = {label: _family_of(kinds[label]) for label in series if not is_count(kinds[label])}
    for label in sorted(found, key=lambda n: (found[n][1], n)):  # in the family's pattern order, then by name
        family = found[label][0]
        families[family.title] = family
        placed.setdefault(family.title, {})[label] = series[label]
    order = [f.title for f in EVAL_FAMILIES] + [f"Eval: {f.title}" for f in FAMILIES] + [f.title for f in FAMILIES]
    titles = sorted(placed, key=lambda t: (order.index(t) if t in order else len(order), t))
    out: dict[str, dict[str, Series]] = {}
    for title in titles:
        chosen = placed[title]
        if families[title].zero_is_empty and all(v == 0 for points in chosen.values() for _, v in points):
            continue
        names = list(chosen)
        chunks = [names[i : i + MAX_SERIES] for i in range(0, len(names), MAX_SERIES)]
        for i, chunk in enumerate(chunks):
            key = title if len(chunks) == 1 else f"{title} ({i + 1}/{len(chunks)})"
            out[key] = {name: chosen[name] for name in chunk}
    return out


def _family_of(kind: str) -> tuple[Family, int]:
    """(the family of a metric named ``kind`` as logged, the index of the pattern it matched); an unknown name gets
    a family named after its first component."""
    for family in EVAL_FAMILIES:
        for i, pattern in enumerate(family.patterns):
            if matches(kind, pattern):
                return family, i
    evaluation = kind.startswith("eval/")
    name = kind.removeprefix("eval/")
    for family in FAMILIES:
        for i, pattern in enumerate(family.patterns):
            if matches(name, pattern):
                return (
                    Family(f"Eval: {family.title}", family.patterns, family.zero_is_empty) if evaluation else family
                ), i
    head = name.split("/", 1)[0]
    return Family(f"Eval: {head}" if evaluation else head, (f"{head}*",)), 0


def thin(points: Series, most: int = 600) -> Series:
    """At most about ``most`` of ``points`` for drawing: above it, each of ``most // 2`` equal runs of points keeps
    its lowest and highest (in step order), so spikes survive; the page's JSON keeps every point."""
    if len(points) <= most:
        return points
    buckets = most // 2
    out: Series = []
    for i in range(buckets):
        run = points[i * len(points) // buckets : (i + 1) * len(points) // buckets]
        if run:
            lo, hi = min(run, key=lambda p: p[1]), max(run, key=lambda p: p[1])
            out.extend(sorted({lo, hi}))
    return out
