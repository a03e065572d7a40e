"""What `grpokit compare` prints and the page it writes: the runs' lines, the config difference, the final
evaluation with deltas, the held-out prompts one run solves and another does not, and (page only) each key
metric's curves overlaid by step and by wall time, one line per run."""

from __future__ import annotations

import json
import time

from grpokit.store.compare import RunData, config_difference, final_evaluation, length_note, solved_difference
from grpokit.store.directions import change_class
from grpokit.store.html_text import number
from grpokit.store.html_text import text as escape
from grpokit.store.page import STYLE
from grpokit.store.panels import collect_series, thin
from grpokit.store.svg import PALETTE, line_chart

# The training metrics overlaid, in this order (evaluation metrics come first, all of them); others are listed.
KEY_METRICS = (
    "reward",
    "frac_reward_zero_std",
    "groups/all_correct_fraction",
    "entropy",
    "kl",
    "loss",
    "grad_norm",
    "completion_length/mean",
    "truncated_fraction",
    "clip_ratio/region_mean",
    "sampling_is/logprob_abs_diff",
    "step_time",
    "tokens_per_second",
)
MAX_PROMPTS = 50  # held-out prompts listed per direction (the counts cover all)


def _value(value) -> str:
    return "-" if value is None else escape(json.dumps(value, default=str) if not isinstance(value, str) else value)


def compare_lines(runs: list[RunData], left_out: list[RunData]) -> list[str]:
    """The text `grpokit compare` prints."""
    lines = [f"{run.name}: {run.path} ({run.last_step} steps)" for run in runs]
    lines += [f"{run.name}: {note}" for run in runs for note in run.notes]
    lines += [f"left out: {run.problem}" for run in left_out]
    note = length_note(runs)
    lines += [note] if note else []
    diff = config_difference(runs)
    lines.append("config difference:" if diff else "config: the same settings")
    lines += [f"  {key}: " + " | ".join(_value(v) for v in values) for key, values in diff]
    lines.append("final evaluation (delta to " + runs[0].name + "):")
    for name, values in final_evaluation(runs):
        base = values[0][1] if values[0] else None
        cells = [_final_cell(v, base, i) for i, v in enumerate(values)]
        lines.append(f"  {name}: " + " | ".join(cells))
    for other in runs[1:]:
        lines += _solved_lines(runs[0], other)
    return lines


def _final_cell(value: tuple[int, float] | None, base: float | None, i: int) -> str:
    if value is None:
        return "-"
    step, v = value
    delta = f" ({v - base:+.4g})" if i and base is not None else ""
    return f"{v:.4g} @ step {step}{delta}"


def _solved_lines(a: RunData, b: RunData) -> list[str]:
    found = solved_difference(a, b)
    if not found:
        return [f"held-out prompts: {a.name} and {b.name} share no evaluation with per-prompt results"]
    lines = []
    for dataset, result in found.items():
        if isinstance(result, str):
            lines.append(result)
            continue
        only_a, only_b = result
        lines.append(f"held-out {dataset}: {len(only_a)} solved by {a.name} only, {len(only_b)} by {b.name} only")
    return lines


def compare_page(runs: list[RunData], left_out: list[RunData]) -> str:
    """The compare page (self-contained, no script)."""
    lines = "".join(f"<li>{escape(run.name)}: {escape(run.path)} ({escape(run.last_step)} steps)</li>" for run in runs)
    notes = [f"{r.name}: {n}" for r in runs for n in r.notes] + [f"left out: {r.problem}" for r in left_out]
    note = length_note(runs)
    notes += [note] if note else []
    notes_html = "".join(f'<p class="error">{escape(n)}</p>' for n in notes)
    body = (
        f"<h1>grpokit compare: {escape(' vs '.join(r.name for r in runs))}</h1>"
        f'<p class="meta">generated {time.strftime("%Y-%m-%d %H:%M:%S")}</p><ul>{lines}</ul>{notes_html}'
        + _config_html(runs)
        + _final_html(runs)
        + "".join(_solved_html(runs[0], other) for other in runs[1:])
        + _curves_html(runs)
    )
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>grpokit compare</title><style>{STYLE}</style></head><body>{body}</body></html>\n"
    )


def _head(runs: list[RunData], first: str) -> str:
    return f"<tr><th>{first}</th>" + "".join(f"<th>{escape(r.name)}</th>" for r in runs) + "</tr>"


def _config_html(runs: list[RunData]) -> str:
    diff = config_difference(runs)
    if not diff:
        return "<h2>Config difference</h2><p>The same settings.</p>"
    rows = "".join(
        f"<tr><td>{escape(key)}</td>" + "".join(f"<td>{_value(v)}</td>" for v in values) + "</tr>"
        for key, values in diff
    )
    return f'<h2>Config difference</h2><table class="changes">{_head(runs, "key")}{rows}</table>'


def _final_html(runs: list[RunData]) -> str:
    rows = []
    for name, values in final_evaluation(runs):
        base = values[0][1] if values[0] else None
        cells = []
        for i, value in enumerate(values):
            if value is None:
                cells.append("<td>-</td>")
                continue
            step, v = value
            delta = ""
            if i and base is not None:
                delta = f' <span class="{change_class(name, v - base)}">{number(v - base, "+.4g")}</span>'
            cells.append(f'<td>{number(v)} <span class="at">(step {escape(step)})</span>{delta}</td>')
        rows.append(f"<tr><td>{escape(name)}</td>{''.join(cells)}</tr>")
    if not rows:
        return "<h2>Final evaluation</h2><p>No evaluation logged.</p>"
    head = _head(runs, "metric")
    title = f"<h2>Final evaluation (delta to {escape(runs[0].name)})</h2>"
    return f'{title}<table class="changes">{head}{"".join(rows)}</table>'


def _solved_html(a: RunData, b: RunData) -> str:
    parts = [f"<h2>Held-out prompts: {escape(a.name)} vs {escape(b.name)}</h2>"]
    found = solved_difference(a, b)
    if not found:
        parts.append("<p>No evaluation with per-prompt results in both runs.</p>")
    for dataset, result in found.items():
        if isinstance(result, str):
            parts.append(f"<p>{escape(result)}</p>")
            continue
        for winner, entries in ((a.name, result[0]), (b.name, result[1])):
            items = "".join(
                f"<tr><td>#{escape(e['prompt_index'])} <code>{escape(str(e['prompt'] or '')[:120])}</code></td>"
                f"<td>{escape(e['a'][0])}/{escape(e['a'][1])}</td><td>{escape(e['b'][0])}/{escape(e['b'][1])}</td></tr>"
                for e in entries[:MAX_PROMPTS]
            )
            more = f'<p class="meta">and {len(entries) - MAX_PROMPTS} more</p>' if len(entries) > MAX_PROMPTS else ""
            head = f"<tr><th>prompt</th><th>{escape(a.name)}</th><th>{escape(b.name)}</th></tr>"
            table = f'<table class="grid">{head}{items}</table>{more}' if entries else ""
            parts.append(f"<h3>{escape(dataset)}: solved by {escape(winner)} only: {len(entries)}</h3>{table}")
    return "".join(parts)


def _curves_html(runs: list[RunData]) -> str:
    per_run = [collect_series(run.metrics + run.derived, run.evals)[0] for run in runs]
    names = sorted({n for s in per_run for n in s if n.startswith("eval/") or " (" in n})
    names = [n for n in names if not n.rsplit("/", 1)[-1].startswith("num_")]
    names += [n for n in KEY_METRICS if any(n in s for s in per_run)]
    colors = {run.name: PALETTE[i % len(PALETTE)] for i, run in enumerate(runs)}
    by_step, by_wall = [], []
    for name in names:
        lines, timed = {}, {}
        for run, series in zip(runs, per_run):
            if name in series:
                lines[run.name] = thin(series[name])
                timed[run.name] = thin([(run.wall[x], y) for x, y in series[name] if x in run.wall])
        by_step.append(line_chart(name, lines, colors=colors))
        by_wall.append(line_chart(name, timed, x_label="seconds since the start", colors=colors))
    legend = " ".join(f'<span style="color:{colors[r.name]}">&#9632; {escape(r.name)}</span>' for r in runs)
    return (
        f'<h2>Curves by step</h2><p class="meta">{legend}</p><div class="charts">{"".join(by_step)}</div>'
        f'<h2>Curves by wall time</h2><div class="charts">{"".join(by_wall)}</div>'
    )
