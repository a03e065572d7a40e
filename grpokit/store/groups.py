"""The report's Groups view: for chosen steps, each prompt's G completions side by side, with each reward
function's value, the total, the advantage, the length and the finish reason; a group whose totals all tie (zero
variance: GRPO learns nothing from it) is flagged.

The page embeds a bounded number of steps (the first, middle and last with rollouts, the steps asked for, and
evenly spaced ones up to :data:`MAX_STEPS`) and of groups per step (:data:`MAX_GROUPS`), and cuts long completions
(:data:`MAX_CHARS`), and stops adding steps at :data:`BUDGET` characters, so a long run's page stays small;
`grpokit report RUN --steps N,M` embeds other steps. A prompt with images shows each one beside it: an ``<img>`` of
its stored file (``RUN/images/<sha256>.png``, store/images.py) by a path relative to the page, so the page works from
``file://`` and the images are not copied into it.
"""

from __future__ import annotations

import math
from pathlib import Path

import yaml

from grpokit.store.html_text import text
from grpokit.store.samples import completion_html, fmt
from grpokit.store.store import RolloutStore
from grpokit.store.thumbs import known_images, thumbnails

MAX_STEPS = 24
MAX_GROUPS = 16
MAX_CHARS = 1200
BUDGET = 4_000_000  # characters of the view's step blocks (of a report kept under 10 MB)


def group_steps(with_rollouts: list[int], chosen: list[int] | None = None, most: int = MAX_STEPS) -> list[int]:
    """The steps the view embeds: ``chosen`` (those with rollouts), else the first, middle and last of
    ``with_rollouts`` (ascending) and evenly spaced others, ``most`` in all."""
    if not with_rollouts:
        return []
    if chosen:
        present = set(with_rollouts)
        return sorted({s for s in chosen if s in present})
    n = len(with_rollouts)
    if n <= most:
        return list(with_rollouts)
    # most - 1 evenly spaced (the first and the last among them) and the middle one
    picks = {round(i * (n - 1) / (most - 2)) for i in range(most - 1)} | {n // 2}
    return [with_rollouts[i] for i in sorted(picks)]


def zero_variance(rewards: list[float | None]) -> bool:
    """A group whose combined rewards all tie (those present; none present counts as a tie): its advantages are 0."""
    present = [r for r in rewards if isinstance(r, (int, float))]
    return not present or max(present) == min(present)


def step_groups(store: RolloutStore, step: int, most: int = MAX_GROUPS) -> tuple[list[list[dict]], int]:
    """(the first ``most`` groups of ``step`` by prompt_index, each its rollouts by completion_index; the step's
    number of groups)."""
    groups: dict[int, list[dict]] = {}
    for rollout in store.rollouts(step=step):
        groups.setdefault(rollout["prompt_index"], []).append(rollout)
    return [groups[p] for p in sorted(groups)[:most]], len(groups)


def groups_html(store: RolloutStore, steps: list[int], budget: int = BUDGET, images_url: str = "images") -> str:
    """The Groups section: a picker (filled by the page's script) and one block per embedded step. Steps are rendered
    first, last, middle, then the others in order, until the blocks reach ``budget`` characters (long completions
    and large groups): the steps past it are named, not embedded. ``images_url``: the run's images folder relative
    to the page."""
    if not steps:
        return '<section id="groups" class="view"><h2>Groups</h2><p>No rollouts stored.</p></section>'
    blocks: dict[int, str] = {}
    size = 0
    for step in _by_priority(steps):
        if size >= budget:
            break
        blocks[step] = _step_html(store, step, images_url)
        size += len(blocks[step])
    listed = ", ".join(str(s) for s in sorted(blocks))
    left = sorted(set(steps) - set(blocks))
    over = f" Left out to keep the page small: steps {', '.join(map(str, left))}." if left else ""
    intro = (
        f'<p class="meta">Steps in this page: {listed}.{over} <code>grpokit report RUN --steps N,M</code> embeds '
        "others; <code>report.html?step=N</code> opens one.</p>"
        '<div class="controls" id="group-controls" hidden></div>'
    )
    body = "".join(blocks[s] for s in sorted(blocks))
    return f'<section id="groups" class="view"><h2>Groups</h2>{intro}{body}</section>'


def _by_priority(steps: list[int]) -> list[int]:
    """``steps`` (ascending) as the first, the last, the middle, then the rest in order."""
    ends = [steps[0], steps[-1], steps[len(steps) // 2]]
    first = list(dict.fromkeys(ends))
    return first + [s for s in steps if s not in first]


def _step_html(store: RolloutStore, step: int, images_url: str = "images") -> str:
    groups, total = step_groups(store, step)
    known = known_images(store, [g[0].get("images") for g in groups])
    flagged = sum(zero_variance([r["reward"] for r in g]) for g in groups)
    shown = f"{len(groups)} of {total} groups shown" if total > len(groups) else f"{total} groups"
    head = (
        f'<h3>Groups of step {text(step)}</h3><p class="meta">{shown}; {flagged} with zero reward variance '
        "(every total ties: advantage 0, nothing learned from them)</p>"
    )
    body = "\n".join(_group_html(step, g, thumbnails(g[0].get("images"), known, images_url)) for g in groups)
    return f'<div class="group-step" data-step="{text(step)}" id="step-{text(step)}">{head}{body}</div>'


def _group_html(step: int, group: list[dict], thumbs: str = "") -> str:
    first = group[0]
    flat = zero_variance([r["reward"] for r in group])
    flag = ' <span class="flag">zero variance</span>' if flat else ""
    names = sorted({str(name) for r in group for name in r["rewards"]})
    header = "".join(f"<th>#{text(r['completion_index'])}</th>" for r in group)
    rows = [("completion", [completion_html(_cut(r)) for r in group])]
    rows += [(text(name), [fmt(r["rewards"].get(name)) for r in group]) for name in names]
    rows += [
        ("total", [fmt(r["reward"]) for r in group]),
        ("advantage", [_advantage(r["advantage"]) for r in group]),
        ("length", [fmt(r["completion_tokens"]) for r in group]),
        ("finish", [text(r["finish_reason"]) + _error(r) for r in group]),
    ]
    body = "".join(
        f'<tr><th scope="row">{label}</th>{"".join(f"<td>{cell}</td>" for cell in cells)}</tr>' for label, cells in rows
    )
    return (
        f'<div class="group{" flat" if flat else ""}"><div class="group-head">step {text(step)} · prompt '
        f"{text(first['prompt_index'])} · {len(group)} completions{flag}</div>"
        f'{thumbs}<pre class="prompt">{text(_cut_text(first["prompt"]))}</pre>'
        f'<div class="scroll"><table class="side"><tr><th></th>{header}</tr>{body}</table></div></div>'
    )


def _advantage(value: float | None) -> str:
    if value is None:
        return '<span class="at">not trained</span>'
    if not isinstance(value, (int, float)):
        return fmt(value)
    kind = "pos" if value > 0 else "neg" if value < 0 else ""
    return f'<span class="{kind}">{fmt(value)}</span>'


def _error(rollout: dict) -> str:
    return f'<div class="error">{text(_cut_text(rollout["error"]))}</div>' if rollout["error"] else ""


def _cut_text(value: str) -> str:
    value = str(value)
    return value if len(value) <= MAX_CHARS else f"{value[:MAX_CHARS]}… ({len(value) - MAX_CHARS} more characters)"


def _cut(rollout: dict) -> dict:
    """The rollout with its completion (and each turn of a conversation) cut to :data:`MAX_CHARS`."""
    out = dict(rollout, completion=_cut_text(rollout["completion"]))
    if rollout.get("conversation"):
        turns = [dict(t, text=_cut_text(t["text"])) for t in rollout["conversation"]["turns"]]
        out["conversation"] = dict(rollout["conversation"], turns=turns)
    return out


def success_threshold(run_dir: Path) -> float:
    """The run's eval.success_threshold (config.yaml; 1.0, its default, when unreadable): a completion whose total
    reaches it counts as correct."""
    try:
        config = yaml.safe_load((run_dir / "config.yaml").read_text(encoding="utf-8"))
        value = float(((config or {}).get("eval") or {}).get("success_threshold", 1.0))
    except (OSError, yaml.YAMLError, TypeError, ValueError, AttributeError):
        return 1.0
    return value if math.isfinite(value) else 1.0


def group_fractions(store: RolloutStore, threshold: float) -> list[dict]:
    """Per step with rewarded rollouts: the fraction of its groups whose every total reaches ``threshold``
    (``groups/all_correct_fraction``) and whose none does (``groups/all_wrong_fraction``): both learn nothing."""
    _, rows = store.query(
        "WITH g AS (SELECT step, prompt_index, min(reward) AS lo, max(reward) AS hi FROM rollouts "
        "WHERE typeof(reward) IN ('real', 'integer') AND typeof(step) = 'integer' GROUP BY step, prompt_index) "
        f"SELECT step, avg(lo >= {threshold!r}), avg(hi < {threshold!r}) FROM g GROUP BY step ORDER BY step"
    )
    return [{"step": s, "groups/all_correct_fraction": ok, "groups/all_wrong_fraction": bad} for s, ok, bad in rows]
