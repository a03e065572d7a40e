"""The summary that opens report.html: model, algorithm, steps, wall time, and the first and last
value of each eval metric (and of the training reward) with the change between them.

Metric names are shown as logged (metrics.jsonl, `grpokit inspect`), so a number in the summary can
be looked up under the same name everywhere else.
"""

from __future__ import annotations

import math
from pathlib import Path

import yaml

from grpokit.store.directions import change_class, direction
from grpokit.store.html_text import number, text

# The config keys that name the algorithm variant (one name, one formula: docs/algorithms.md).
ALGORITHM_KEYS = ("algorithm", "advantage_estimator", "loss_type", "scale_rewards", "importance_sampling_level", "beta")


def is_count(name: str) -> bool:
    """Metrics that count things (eval/num_prompts): summarised, never plotted beside fractions."""
    return name.rsplit("/", 1)[-1].startswith("num_")


def run_summary(run_dir: Path, metrics: list[dict], evals: list[dict], written_at: tuple[float, float] | None) -> dict:
    """{"model", "algorithm", "steps", "max_steps", "wall_seconds", "counts", "changes"}.

    ``changes``: [{"name", "first_step", "first", "last_step", "last", "change"}] for every eval metric
    (eval rows, or metric rows' ``eval/`` names) and the training ``reward``; ``written_at``: the store's
    first and last step timestamps (None without a store). Unknown values are None."""
    config = _read_config(run_dir / "config.yaml")
    algo = section(config, "algo")
    steps = [
        row["step"]
        for row in metrics
        if row.get("step", 0) > 0 and any(not k.startswith("eval/") for k in row if k != "step")
    ]
    wall = None
    if written_at is not None and None not in written_at and steps:
        first_step_time = next((row.get("step_time") for row in metrics if row["step"] == min(steps)), None)
        wall = written_at[1] - written_at[0] + (first_step_time if _finite(first_step_time) else 0.0)
    series: dict[str, list[tuple[int, float]]] = {}
    for row in evals:
        for name, value in row.items():
            if name not in ("step", "dataset") and _finite(value):
                series.setdefault(eval_label(name, row["dataset"]), []).append((row["step"], value))
    if not evals:
        for row in metrics:
            for name, value in row.items():
                if name.startswith("eval/") and _finite(value):
                    series.setdefault(name, []).append((row["step"], value))
    for row in metrics:
        if _finite(row.get("reward")) and row["step"] > 0:
            series.setdefault("reward", []).append((row["step"], row["reward"]))
    changes, counts = [], {}
    for name, points in series.items():
        points.sort()
        if is_count(name):
            counts[name] = points[-1][1]
            continue
        (s0, v0), (s1, v1) = points[0], points[-1]
        changes.append({"name": name, "first_step": s0, "first": v0, "last_step": s1, "last": v1, "change": v1 - v0})
    return {
        "model": section(config, "model").get("model_name_or_path"),
        "algorithm": {key: algo[key] for key in ALGORITHM_KEYS if key in algo},
        "steps": max(steps) if steps else 0,
        "max_steps": section(config, "optim").get("max_steps"),
        "wall_seconds": wall,
        "counts": counts,
        "changes": changes,
    }


def eval_label(name: str, dataset: str) -> str:
    """An eval metric's name as logged; another dataset than the trainer's "eval" is named after it."""
    return name if dataset == "eval" else f"{name} ({dataset})"


def summary_html(summary: dict) -> str:
    algorithm = ", ".join(f"{k}={v}" for k, v in summary["algorithm"].items()) or "-"
    of = f" of {summary['max_steps']}" if summary["max_steps"] else ""
    facts = [
        ("model", summary["model"] or "-"),
        ("algorithm", algorithm),
        ("steps", f"{summary['steps']}{of}"),
        ("wall time", _duration(summary["wall_seconds"])),
    ]
    facts += [(name, number(value, "g")) for name, value in summary["counts"].items()]
    # the metrics with a good direction first; the others (entropy, lengths, loss ...) folded below them
    key = [c for c in summary["changes"] if direction(c["name"]) and not c["first"] == c["last"] == 0]
    other = [c for c in summary["changes"] if c not in key]
    table = _changes_table(key or other) if summary["changes"] else "<p>No eval or reward values logged yet.</p>"
    if key and other:
        table += f"<details><summary>{len(other)} other metrics</summary>{_changes_table(other)}</details>"
    dl = "".join(f"<dt>{text(k)}</dt><dd>{text(v)}</dd>" for k, v in facts)
    return f'<section class="summary"><h2>Summary</h2><dl>{dl}</dl>{table}</section>'


def _changes_table(changes: list[dict]) -> str:
    rows = "".join(
        f"<tr><td>{text(c['name'])}</td>"
        f'<td>{number(c["first"])} <span class="at">(step {text(c["first_step"])})</span></td>'
        f'<td>{number(c["last"])} <span class="at">(step {text(c["last_step"])})</span></td>'
        f'<td class="{change_class(c["name"], c["change"])}">{number(c["change"], "+.4g")}</td></tr>'
        for c in changes
    )
    return f'<table class="changes"><tr><th>metric</th><th>first</th><th>last</th><th>change</th></tr>{rows}</table>'


def section(config: dict, name: str) -> dict:
    """``config[name]`` when it is a mapping, else {} (a config.yaml from elsewhere can hold anything)."""
    value = config.get(name)
    return value if isinstance(value, dict) else {}


def _read_config(path: Path) -> dict:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return {}
    return data if isinstance(data, dict) else {}


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min" if hours else f"{minutes} min {secs} s" if minutes else f"{seconds:.1f} s"
