"""Held-out prompts over time: each evaluation's per-prompt results (the store's ``eval_prompts``), and which
prompts the run learned, kept, forgot or never solved.

A prompt is *solved* at an evaluation when at least half of its samples reached the success threshold
(``correct / samples >= 0.5``). Over a dataset's evaluations, in order: *learned*: solved at the last, not at the
first; *kept*: solved at the first and the last; *forgotten*: solved at some evaluation but not at the last;
*never solved*: solved at none. `grpokit compare` uses the same rule on each run's last evaluation.
"""

from __future__ import annotations

import json

from grpokit.store.html_text import text
from grpokit.store.store import RolloutStore
from grpokit.store.thumbs import known_images, thumbnails

CATEGORIES = ("learned", "forgotten", "never solved", "kept")
MAX_ROWS = 200  # prompts listed per category (the counts cover all)
MAX_COLUMNS = 30  # evaluations shown per table, evenly spaced, the first and the last included


def solved(correct: int, samples: int) -> bool:
    return samples > 0 and 2 * correct >= samples


def category(results: list[tuple[int, int]]) -> str:
    """The category (module docstring) of a prompt with ``results``: (correct, samples) per evaluation, in order."""
    marks = [solved(c, n) for c, n in results]
    if marks[-1]:
        return "kept" if marks[0] else "learned"
    return "forgotten" if any(marks) else "never solved"


def eval_prompts(store: RolloutStore) -> dict[str, dict]:
    """{dataset: {"steps": [eval steps], "prompts": {prompt_index: {"prompt", "images": [sha256] or None,
    "results": {step: (correct, samples)}}}}}; {} for a store without per-prompt results (written before they were
    kept)."""
    columns = ("dataset", "step", "prompt_index", "prompt", "correct", "samples", "images")
    rows = store.typed("eval_prompts", columns, "dataset, step")  # [] without the table
    out: dict[str, dict] = {}
    for dataset, step, index, prompt, correct, samples, hashes in rows:
        data = out.setdefault(dataset, {"steps": [], "prompts": {}})
        if not data["steps"] or data["steps"][-1] != step:
            data["steps"].append(step)
        entry = data["prompts"].setdefault(index, {"prompt": prompt, "images": None, "results": {}})
        entry["results"][step] = (correct, samples)
        entry["images"] = _hashes(hashes) or entry["images"]
    return out


def _hashes(column: str | None) -> list[str] | None:
    """An ``images`` column's hashes; None for null or a value that is not a JSON list (a store edited by hand)."""
    try:
        value = json.loads(column) if column is not None else None
    except (json.JSONDecodeError, TypeError, RecursionError):
        return None
    return value if isinstance(value, list) else None


def categorize(data: dict) -> dict[str, list[int]]:
    """{category: prompt indices} of one dataset's :func:`eval_prompts` entry, over the evaluations each prompt has."""
    out: dict[str, list[int]] = {name: [] for name in CATEGORIES}
    for index, entry in sorted(data["prompts"].items()):
        results = [entry["results"][s] for s in data["steps"] if s in entry["results"]]
        out[category(results)].append(index)
    return out


def heldout_html(per_dataset: dict[str, dict], images_url: str = "images", store: RolloutStore | None = None) -> str:
    """The Held-out prompts section: per dataset, the counts per category and a table per category (prompt and its
    images' thumbnails from ``images_url`` as ``store`` holds them, then correct/samples at each evaluation, shaded
    by the fraction correct)."""
    if not per_dataset:
        body = "<p>No per-prompt evaluation results stored (the run has no eval set, or predates them).</p>"
        return f'<section id="heldout" class="view"><h2>Held-out prompts</h2>{body}</section>'
    entries = [e for data in per_dataset.values() for e in data["prompts"].values()]
    thumbs = (known_images(store, [e.get("images") for e in entries]) if store is not None else {}, images_url)
    parts = []
    for dataset, data in per_dataset.items():
        groups = categorize(data)
        steps = _spaced(data["steps"])
        counts = ", ".join(f"{len(groups[c])} {c}" for c in CATEGORIES)
        parts.append(
            f"<h3>{text(dataset)}: {len(data['prompts'])} prompts, {len(data['steps'])} evaluations</h3>"
            f'<p class="meta">{counts} (solved: at least half the samples correct)</p>'
        )
        for name in CATEGORIES:
            indices = groups[name]
            if indices:
                parts.append(_table(name, indices, data, steps, thumbs))
    bar = '<div class="controls" id="heldout-controls" hidden></div>'
    return f'<section id="heldout" class="view"><h2>Held-out prompts</h2>{bar}{"".join(parts)}</section>'


def _spaced(steps: list[int]) -> list[int]:
    if len(steps) <= MAX_COLUMNS:
        return steps
    return sorted({steps[round(i * (len(steps) - 1) / (MAX_COLUMNS - 1))] for i in range(MAX_COLUMNS)})


def _table(name: str, indices: list[int], data: dict, steps: list[int], thumbs: tuple = ({}, "images")) -> str:
    head = "".join(f"<th>{text(s)}</th>" for s in steps)
    rows = []
    for index in indices[:MAX_ROWS]:
        entry = data["prompts"][index]
        cells = "".join(_cell(entry["results"].get(s)) for s in steps)
        prompt = text(str(entry["prompt"] or "")[:120])
        images = thumbnails(entry.get("images"), *thumbs)
        rows.append(f'<tr><td class="p">#{text(index)} <code>{prompt}</code>{images}</td>{cells}</tr>')
    more = f'<p class="meta">and {len(indices) - MAX_ROWS} more</p>' if len(indices) > MAX_ROWS else ""
    return (
        f'<div class="heldout" data-category="{name}"><h4>{name}: {len(indices)}</h4>'
        f'<div class="scroll"><table class="grid"><tr><th>prompt \\ step</th>{head}</tr>{"".join(rows)}</table></div>'
        f"{more}</div>"
    )


def _cell(result: tuple[int, int] | None) -> str:
    if result is None:
        return "<td></td>"
    correct, samples = result
    counted = all(isinstance(n, int) for n in result) and samples
    shade = round(4 * correct / samples) if counted else 0  # 0..4: none .. all correct
    return f'<td class="s{shade}">{text(correct)}/{text(samples)}</td>'
