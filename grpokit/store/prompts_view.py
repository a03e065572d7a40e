"""The report's Prompts view: each training prompt's pass rate across steps as a heat map, rows sorted by the step the
prompt was learned, retired prompts marked, and how often each was sampled.

Everything is replayed from the stored rollouts in step order with the rule of the store's ``prompt_history`` table
(store/prompt_history.py: its window and success threshold, from the store's meta keys), so an older store without
the table gets the view too:

- a prompt's *recent pass rate* after a step is the pass fraction of its last ``window`` completions (a reward that
  failed does not pass);
- it was *learned* at the first step after which its recent pass rate is >= ``data.pool_easy_above`` (0.8 unless the
  run's config.yaml sets it: the pools' "easy");
- it is *retired* when the run sets ``data.retire_after`` K and its last K visits (steps that drew it) in a row had
  every completion pass (the table's ``solved_streak`` >= K).

Rows: learned prompts by the step learned, then the others by their last recent pass rate (highest first), the
prompt index breaking ties. A cell is the fraction of the prompt's completions that passed in that column's steps
(empty: not sampled there), shaded in five steps from none to all. The page stays bounded: at most :data:`MAX_ROWS`
prompts (evenly spaced in that order, the first and last kept) and :data:`MAX_COLUMNS` columns (runs of consecutive
steps with rollouts, of near-equal length, when a run has more steps).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from grpokit.store.html_text import text
from grpokit.store.prompt_history import DEFAULT_THRESHOLD, DEFAULT_WINDOW, window_stats
from grpokit.store.store import RolloutStore

MAX_ROWS = 200
MAX_COLUMNS = 60
LEARNED_AT = 0.8  # data.pool_easy_above's default
_META = "SELECT key, value FROM meta WHERE key IN ('prompt_history.window', 'prompt_history.threshold')"


@dataclass
class Track:
    """One prompt's replayed history."""

    prompt: str | None = None
    visits: int = 0
    samples: int = 0
    recent: list = field(default_factory=list)
    pass_rate: float = math.nan
    learned: int | None = None
    streak: int = 0
    per_step: dict[int, tuple[int, int]] = field(default_factory=dict)  # step: (passed, completions)


def history_settings(store: RolloutStore) -> tuple[int, float]:
    """(window, threshold) the store keeps its prompt history with; the defaults where its meta is missing or not
    numbers (a store edited by hand)."""
    found = dict(store.query(_META)[1])
    try:
        window = int(found.get("prompt_history.window", DEFAULT_WINDOW))
    except (TypeError, ValueError):
        window = DEFAULT_WINDOW
    try:
        threshold = float(found.get("prompt_history.threshold", DEFAULT_THRESHOLD))
    except (TypeError, ValueError):
        threshold = DEFAULT_THRESHOLD
    return max(window, 1), threshold if math.isfinite(threshold) else DEFAULT_THRESHOLD


def run_settings(run_dir: Path) -> tuple[float, int | None]:
    """(learned-at pass rate, retire_after) from the run's config.yaml: ``data.pool_easy_above`` (0.8 when absent or
    not a number in (0, 1]) and ``data.retire_after`` (None when absent or not an integer >= 1)."""
    try:
        data = (yaml.safe_load((run_dir / "config.yaml").read_text(encoding="utf-8")) or {}).get("data") or {}
        learned, retire = data.get("pool_easy_above", LEARNED_AT), data.get("retire_after")
    except (OSError, yaml.YAMLError, AttributeError):
        return LEARNED_AT, None
    good = isinstance(learned, (int, float)) and not isinstance(learned, bool) and 0 < learned <= 1
    retire_ok = isinstance(retire, int) and not isinstance(retire, bool) and retire >= 1
    return float(learned) if good else LEARNED_AT, retire if retire_ok else None


def replay(store: RolloutStore, window: int, threshold: float, learned_at: float) -> dict[int, Track]:
    """{prompt_index: its Track}, from the stored rollouts step by step (module docstring)."""
    rows = store.typed("rollouts", ("step", "prompt_index", "reward", "prompt"), "step, prompt_index, completion_index")
    tracks: dict[int, Track] = {}
    key, rewards = None, []
    for step, index, reward, prompt in [*rows, (None, None, None, None)]:
        if (step, index) != key and key is not None:
            _visit(tracks.setdefault(key[1], Track()), key[0], rewards, window, threshold, learned_at)
            rewards = []
        key = (step, index)
        rewards.append(reward)
        if index is not None and prompt is not None:
            tracks.setdefault(index, Track()).prompt = prompt
    return tracks


def _visit(track: Track, step: int, rewards: list, window: int, threshold: float, learned_at: float) -> None:
    passed = [r is not None and r >= threshold for r in rewards]
    track.visits += 1
    track.samples += len(rewards)
    track.per_step[step] = (sum(passed), len(passed))
    track.recent = (track.recent + rewards)[-window:]
    track.pass_rate = window_stats(track.recent, threshold)[0]
    track.streak = track.streak + 1 if all(passed) else 0
    if track.learned is None and track.pass_rate >= learned_at:
        track.learned = step


def ordered(tracks: dict[int, Track]) -> list[int]:
    """Prompt indices, learned ones by the step learned, then the others by recent pass rate, highest first."""
    return sorted(tracks, key=lambda i: (tracks[i].learned is None, tracks[i].learned or 0, -tracks[i].pass_rate, i))


def spaced(items: list, most: int) -> list:
    """``items`` when there are at most ``most``, else ``most`` of them evenly spaced, the first and last included."""
    if len(items) <= most:
        return list(items)
    return [items[round(i * (len(items) - 1) / (most - 1))] for i in range(most)]


def column_runs(steps: list[int], most: int = MAX_COLUMNS) -> list[list[int]]:
    """``steps`` (ascending) cut into at most ``most`` runs of consecutive entries, of lengths differing by <= 1."""
    n = len(steps)
    parts = min(n, most)
    return [steps[i * n // parts : (i + 1) * n // parts] for i in range(parts)]


def prompts_html(store: RolloutStore, run_dir: Path) -> str:
    """The Prompts section (module docstring)."""
    window, threshold = history_settings(store)
    learned_at, retire_after = run_settings(Path(run_dir))
    tracks = replay(store, window, threshold, learned_at)
    if not tracks:
        return '<section id="prompts" class="view"><h2>Prompts</h2><p>No rollouts stored.</p></section>'
    steps = sorted({s for t in tracks.values() for s in t.per_step})
    runs = column_runs(steps)
    order = ordered(tracks)
    shown = spaced(order, MAX_ROWS)
    retired = {i for i, t in tracks.items() if retire_after is not None and t.streak >= retire_after}
    learned = sum(1 for t in tracks.values() if t.learned is not None)
    retire_text = (
        f"{len(retired)} retired (every completion passed in their last {retire_after} visits: data.retire_after)"
        if retire_after is not None
        else "none retired (the run does not set data.retire_after)"
    )
    meta = (
        f'<p class="meta">{len(tracks)} prompts sampled, {learned} learned (recent pass rate over the last {window} '
        f"completions reached {learned_at:g}), {retire_text}. A completion passes at reward &gt;= {threshold:g}. "
        f"Rows: by the step learned, then the others by recent pass rate"
        + (f"; {len(shown)} of {len(tracks)} shown, evenly spaced in that order" if len(shown) < len(order) else "")
        + f". Columns: {len(steps)} steps"
        + (f" in {len(runs)} runs of consecutive steps" if len(runs) < len(steps) else "")
        + ". <code>grpokit inspect RUN --prompts</code> lists every prompt.</p>"
    )
    head = "".join(f'<th title="{_span(r)}">{r[0]}</th>' for r in runs)
    body = "".join(_row(i, tracks[i], runs, i in retired) for i in shown)
    table = (
        '<div class="scroll"><table class="heat"><tr><th>prompt</th><th>learned at</th><th>visits</th>'
        f"<th>samples</th><th>recent pass rate</th>{head}</tr>{body}</table></div>"
    )
    return f'<section id="prompts" class="view"><h2>Prompts</h2>{meta}{table}</section>'


def _row(index: int, track: Track, runs: list[list[int]], retired: bool) -> str:
    cells = "".join(_cell(track, run) for run in runs)
    flag = ' <span class="flag">retired</span>' if retired else ""
    prompt = text(str(track.prompt or "")[:60])
    learned = text(track.learned) if track.learned is not None else "-"
    marked = ' class="retired"' if retired else ""
    return (
        f'<tr data-prompt="{text(index)}"{marked}>'
        f'<td class="p">#{text(index)} <code>{prompt}</code>{flag}</td><td>{learned}</td><td>{track.visits}</td>'
        f"<td>{track.samples}</td><td>{track.pass_rate:.2f}</td>{cells}</tr>"
    )


def _cell(track: Track, run: list[int]) -> str:
    seen = [track.per_step[s] for s in run if s in track.per_step]
    if not seen:
        return "<td></td>"
    passed, total = sum(p for p, _ in seen), sum(n for _, n in seen)
    return f'<td class="h{round(4 * passed / total)}" title="{_span(run)}: {passed}/{total} passed"></td>'


def _span(run: list[int]) -> str:
    return f"step {run[0]}" if len(run) == 1 else f"steps {run[0]}-{run[-1]}"
