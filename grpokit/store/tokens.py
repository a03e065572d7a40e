"""The report's Tokens view: a completion's tokens, each decoded on its own, coloured by a per-token value the store
kept (``run.store_token_values``; grpokit/store/token_values.py): the learner's log-prob, the sampler-learner gap,
the entropy, or the token's weight in the policy loss (0: clipped or masked).

Without JavaScript the tokens are coloured by :data:`DEFAULT_ORDER`'s first kept value (an inline style) and each
token's title lists all its values; the page's script (store/page.py) recolours them by the value picked in a
selector, with the same scales (:func:`colour`, mirrored by ``TOKEN_SCRIPT``); ``report.html?view=tokens&token=weight``
opens the view coloured by a value. The view embeds a few completions of
a few steps (:data:`PER_STEP`, :data:`MAX_TOKENS`, :data:`MAX_STEPS`) so a long run's page stays small.
"""

from __future__ import annotations

import functools
import math

from grpokit.store.html_text import text
from grpokit.store.samples import fmt
from grpokit.store.store import RolloutStore
from grpokit.store.thumbs import known_images, thumbnails
from grpokit.store.token_values import TOKEN_VALUES

PER_STEP = 4  # completions per step: the best and the worst rewarded, the largest gap, the least weight
MAX_STEPS = 12  # steps shown, however many --steps names (the first ones)
MAX_TOKENS = 256  # tokens shown per completion
DEFAULT_ORDER = ("gap", "weight", "logprob", "entropy")
GAP_FLOOR = 0.1  # nats: gaps below this stay pale, however small the page's largest gap
LOGPROB_RANGE = 5.0  # nats: a log-prob of -5 or below is full red

# Each scale's legend (the page shows the chosen one's).
LEGEND = {
    "logprob": "white: the learner was sure (log-prob 0); red: unlikely (-5 or below)",
    "gap": "white: sampler and learner agree; red: the learner's log-prob is higher, blue: lower "
    "(full colour at the page's largest |gap|, at least 0.1)",
    "entropy": "white: 0; purple: the page's highest entropy",
    "weight": "white: 1; orange to grey: less (grey 0: clipped or masked, no gradient); green: above 1 "
    "(importance-weighted)",
}

# The same scales in the page's script: colour(name, value, scale) -> an rgb() string.
TOKEN_SCRIPT = """
  const mix = (a, b, t) => "rgb(" + a.map((x, i) => Math.round(x + (b[i] - x) * Math.min(1, Math.max(0, t))))
    .join(",") + ")";
  const W = [255, 255, 255], RED = [214, 39, 40], BLUE = [31, 119, 180], PURPLE = [118, 42, 131],
    GREY = [150, 150, 150], ORANGE = [255, 187, 120], GREEN = [44, 160, 44];
  const colour = (name, v, scale) => { if (v === null || isNaN(v)) return "rgb(238,238,238)";
    if (name === "logprob") return mix(W, RED, -v / 5);
    if (name === "gap") return mix(W, v >= 0 ? RED : BLUE, Math.abs(v) / scale);
    if (name === "entropy") return mix(W, PURPLE, v / scale);
    if (v >= 1) return mix(W, GREEN, (v - 1) / 2);
    return v <= 0 ? mix(W, GREY, 1) : mix(W, ORANGE, 1 - v); };
  const view = $("#tokens"), pick = $("#token-value");
  if (view && pick) { pick.hidden = false; $("#token-controls").hidden = false;
    const names = view.dataset.values.split(","), scales = JSON.parse(view.dataset.scales);
    const recolour = () => { const i = names.indexOf(pick.value);
      $$("span.tok", view).forEach(s => { const v = s.dataset.v.split(",")[i];
        s.style.background = colour(pick.value, v === "" ? null : Number(v), scales[pick.value]); });
      $$(".token-legend", view).forEach(l => { l.hidden = l.dataset.value !== pick.value; }); };
    const asked = new URLSearchParams(location.search).get("token");
    if (names.includes(asked)) pick.value = asked;
    pick.addEventListener("change", recolour); recolour(); }
"""

_WHITE, _RED, _BLUE = (255, 255, 255), (214, 39, 40), (31, 119, 180)
_PURPLE, _GREY, _ORANGE, _GREEN = (118, 42, 131), (150, 150, 150), (255, 187, 120), (44, 160, 44)


def _mix(a: tuple, b: tuple, t: float) -> str:
    t = min(1.0, max(0.0, t))
    return "rgb(" + ",".join(str(round(x + (y - x) * t + 1e-9)) for x, y in zip(a, b)) + ")"


def colour(name: str, value: float | None, scale: float) -> str:
    """The background of a token whose ``name`` value is ``value`` (``scale``: the gap's or the entropy's full
    colour); the page's script computes the same (``TOKEN_SCRIPT``)."""
    if value is None or math.isnan(value):
        return "rgb(238,238,238)"
    if name == "logprob":
        return _mix(_WHITE, _RED, -value / LOGPROB_RANGE)
    if name == "gap":
        return _mix(_WHITE, _RED if value >= 0 else _BLUE, abs(value) / scale)
    if name == "entropy":
        return _mix(_WHITE, _PURPLE, value / scale)
    if value >= 1:
        return _mix(_WHITE, _GREEN, (value - 1) / 2)
    return _mix(_WHITE, _GREY, 1.0) if value <= 0 else _mix(_WHITE, _ORANGE, 1 - value)


def token_steps(store: RolloutStore, chosen: list[int] | None = None) -> list[int]:
    """The steps the view shows: ``chosen`` (those with per-token values), else the first, middle and last with them
    (a store with per-token values only)."""
    _, rows = store.query("SELECT DISTINCT step FROM token_values WHERE typeof(step) = 'integer' ORDER BY step")
    steps = [s for (s,) in rows]
    if chosen:
        return sorted(set(chosen) & set(steps))[:MAX_STEPS]
    return sorted({steps[0], steps[len(steps) // 2], steps[-1]}) if steps else []


def tokens_html(store: RolloutStore, steps: list[int] | None = None, images_url: str = "images") -> str:
    """The Tokens section: per shown step, a few completions' tokens coloured by a per-token value (module
    docstring), under each its prompt and the prompt's images (thumbnails of ``images_url``, the run's images folder
    relative to the page); a line naming the setting when the run kept none."""
    names = store.token_value_names()
    head = '<section id="tokens" class="view"><h2>Tokens</h2>'
    if not names:
        return (
            f"{head}<p>No per-token values stored. Set <code>run.store_token_values: [all]</code> (or some of "
            f"{', '.join(TOKEN_VALUES)}) to keep them (docs/runs.md gives their cost).</p></section>"
        )
    picked = [(step, _chosen(store, step, names)) for step in token_steps(store, steps)]
    scales = _scales([c for _, chosen in picked for c in chosen])
    default = next(name for name in DEFAULT_ORDER if name in names)
    known = known_images(store, [c.get("images") for _, chosen in picked for c in chosen])
    draw = functools.partial(_completion_html, names=names, default=default, scales=scales, thumbs=(known, images_url))
    options = "".join(
        f'<option value="{n}"{" selected" if n == default else ""}>{n}: {text(TOKEN_VALUES[n])}</option>' for n in names
    )
    legends = "".join(
        f'<p class="meta token-legend" data-value="{n}"{"" if n == default else " hidden"}>{n}: {text(LEGEND[n])}</p>'
        for n in names
    )
    intro = (
        f'<p class="meta">Each completion\'s tokens coloured by a per-token value (<b>{default}</b>, '
        f"{text(TOKEN_VALUES[default])}, unless another is chosen); "
        "hover a token for all its values. The best and worst rewarded completions of each step shown, and those "
        "with the largest gap and the least weight.</p>"
        f'<div class="controls" id="token-controls" hidden>Colour by <select id="token-value" hidden>{options}'
        f"</select></div>{legends}"
    )
    body = "".join(f"<h3>Step {step}</h3>{''.join(draw(c) for c in chosen)}" for step, chosen in picked)
    data = f'data-values="{",".join(names)}" data-scales="{text(_scales_json(scales))}"'
    return f'<section id="tokens" class="view" {data}><h2>Tokens</h2>{intro}{body}</section>'


def _chosen(store: RolloutStore, step: int, names: list[str]) -> list[dict]:
    """Up to :data:`PER_STEP` of ``step``'s completions with values, each its rollout's fields and its values."""
    rollouts = {(r["prompt_index"], r["completion_index"]): r for r in store.rollouts(step=step)}
    items = [dict(rollouts.get((v["prompt_index"], v["completion_index"]), {}), **v) for v in store.token_values(step)]
    if not items:
        return []
    rewarded = [i for i in items if i.get("reward") is not None]
    picks = []
    if rewarded:
        picks += [max(rewarded, key=lambda i: i["reward"]), min(rewarded, key=lambda i: i["reward"])]
    if "gap" in names:
        picks.append(max(items, key=lambda i: max((abs(v) for v in i["gap"] or () if not math.isnan(v)), default=0.0)))
    if "weight" in names:
        picks.append(min(items, key=lambda i: sum(i["weight"] or ()) / max(len(i["weight"] or ()), 1)))
    seen, out = set(), []
    for item in picks or items[:1]:
        key = (item["prompt_index"], item["completion_index"])
        if key not in seen:
            seen.add(key)
            out.append(item)
    return out[:PER_STEP]


def _scales(items: list[dict]) -> dict[str, float]:
    """Full colour of the gap (the largest |gap| shown, at least :data:`GAP_FLOOR`) and the entropy (the highest)."""

    def largest(name: str, floor: float) -> float:
        values = [abs(v) for i in items for v in (i.get(name) or []) if not math.isnan(v)]
        return max([floor, *values])

    gap, entropy = largest("gap", GAP_FLOOR), largest("entropy", 1e-6)
    return {"logprob": LOGPROB_RANGE, "gap": gap, "entropy": entropy, "weight": 1.0}


def _scales_json(scales: dict[str, float]) -> str:
    return "{" + ",".join(f'"{k}":{v:.6g}' for k, v in scales.items()) + "}"


def _completion_html(
    item: dict, names: list[str], default: str, scales: dict[str, float], thumbs: tuple[dict, str] = ({}, "images")
) -> str:
    n = len(item["tokens"])
    shown = range(min(n, MAX_TOKENS))
    spans = []
    for t in shown:
        values = [_at(item[name], t) for name in names]
        title = " · ".join(f"{name} {_short(v)}" for name, v in zip(names, values))
        data = ",".join("" if math.isnan(v) else _short(v) for v in values)
        background = colour(default, values[names.index(default)], scales[default])
        spans.append(
            f'<span class="tok" style="background:{background}" title="{title}" data-v="{data}">'
            f"{text(item['tokens'][t])}</span>"
        )
    more = f'<span class="at"> … {n - MAX_TOKENS} more tokens</span>' if n > MAX_TOKENS else ""
    head = (
        f"step {text(item['step'])} · prompt {text(item['prompt_index'])} · #{text(item['completion_index'])} · reward "
        f"{fmt(item.get('reward'))} · advantage {fmt(item.get('advantage'))} · {n} tokens"
    )
    prompt = f'<pre class="prompt">{text(str(item["prompt"])[-400:])}</pre>' if item.get("prompt") else ""
    prompt += thumbnails(item.get("images"), *thumbs)
    tokens = f'<div class="toks">{"".join(spans)}{more}</div>'
    return f'<div class="sample tokens-of"><div class="group-head">{head}</div>{prompt}{tokens}</div>'


def _at(values: list[float] | None, t: int) -> float:
    """Token ``t``'s value; NaN where the completion has none (a value kept for other completions only)."""
    return values[t] if values is not None and t < len(values) else math.nan


def _short(value: float) -> str:
    return "nan" if math.isnan(value) else f"{value:.3g}"
