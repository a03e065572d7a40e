"""`grpokit report RUN`: RUN/report.html, one self-contained page: a summary (model, algorithm,
steps, wall time, first and last eval values), curves and sample completions.

The page needs no network and no JavaScript: charts are inline SVG, styles are inline CSS. The
curves' numbers and the summary are also embedded as JSON (`<script type="application/json">`
elements `grpokit-data` and `grpokit-summary`) so they can be read back without parsing the page.
Series are labelled with the metric names as logged; each chart holds metrics of one kind (counts
such as eval/num_prompts are in the summary, never on an axis with fractions).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import time
from html import escape
from pathlib import Path

from grpokit.algos.names import CLIP_REGION, KL
from grpokit.store.store import RolloutStore, StoreError, resolve_store_path
from grpokit.store.summary import eval_label, is_count, run_summary, summary_html
from grpokit.store.svg import Series, line_chart

REPORT_FILENAME = "report.html"
METRICS_FILENAME = "metrics.jsonl"

# (chart title, metric names); "rewards/*/mean" stands for every reward function's mean. A series
# goes to the first chart that names it; counts (num_*) go to none.
CHARTS = (
    ("Eval: pass@k and greedy accuracy (fraction of prompts)", ("eval/pass@*", "eval/greedy_accuracy")),
    ("Eval: mean reward", ("eval/reward",)),
    ("Eval: other metrics", ("eval/*",)),
    ("Reward", ("reward", "rewards/*/mean")),
    ("KL to the reference", (KL,)),
    ("Entropy", ("entropy",)),
    ("Completion length (tokens)", ("completion_length/mean",)),
    ("Clipped fraction (region mean)", (CLIP_REGION,)),
    ("Learning rate", ("learning_rate",)),
    ("Staleness (updates between sampling and training)", ("policy_staleness",)),
    ("Waiting per step (s): learner for data, producer on the staleness bound", ("async/*_wait_s",)),
    ("Behaviour importance weights", ("sampling_is/weight_*",)),
    ("Behaviour weights clipped or masked (fraction of tokens)", ("sampling_is/*_fraction",)),
)

_STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 24px auto; max-width: 1200px; color: #222; }
h1 { font-size: 22px; margin-bottom: 4px; } h2 { font-size: 18px; margin-top: 32px; }
.meta { color: #666; } .charts { display: flex; flex-wrap: wrap; gap: 12px; }
.chart { background: #fff; border: 1px solid #ddd; border-radius: 4px; }
.chart .title { font-weight: 600; font-size: 13px; } .chart .tick { font-size: 11px; fill: #555; }
.chart .legend { font-size: 11px; fill: #333; } .chart .frame { fill: none; stroke: #bbb; }
.chart .grid { stroke: #eee; } .chart .axis { stroke: #999; }
.sample { border: 1px solid #ddd; border-radius: 4px; margin: 8px 0; padding: 8px 12px; }
.sample.best { border-left: 4px solid #59a14f; } .sample.worst { border-left: 4px solid #e15759; }
.summary dl { display: grid; grid-template-columns: max-content auto; gap: 2px 16px; margin: 8px 0; }
.summary dt { color: #666; } .summary dd { margin: 0; }
.changes { border-collapse: collapse; margin: 8px 0; } .changes td, .changes th { padding: 3px 12px;
  border-bottom: 1px solid #eee; text-align: right; } .changes td:first-child, .changes th:first-child
  { text-align: left; font-family: ui-monospace, monospace; } .at { color: #888; font-size: 12px; }
.up { color: #2e7d32; font-weight: 600; } .down { color: #c62828; font-weight: 600; }
.sample pre { white-space: pre-wrap; word-break: break-word; margin: 6px 0; font-size: 13px;
  background: #f7f7f7; padding: 6px; } .prompt { color: #555; } .error { color: #b00; }
.sample pre.tool { background: #eef4fb; color: #1f4e79; margin-left: 24px; }
"""


def write_report(run_dir: str | Path, steps: list[int] | None = None, output: str | Path | None = None) -> Path:
    """Write RUN/report.html (or ``output``) and return its path.

    Curves come from the store's step metrics, or from RUN/metrics.jsonl when the store has none;
    metrics a run did not log are skipped. Sample completions (best and worst by reward) are
    shown for `steps`, by default the first, middle and last step with rollouts. The page is written to a
    temporary file beside it, then renamed: a stop or a full disk while writing leaves the previous report whole.
    """
    path = Path(output) if output is not None else Path(run_dir) / REPORT_FILENAME
    write_page(path, report_page(run_dir, steps))
    return path


def report_page(run_dir: str | Path, steps: list[int] | None = None) -> str:
    """The report of the run in ``run_dir`` as one HTML page (see :func:`write_report`); reads only."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise StoreError(f"no run folder at {run_dir}")
    store_path = resolve_store_path(run_dir)
    if not store_path.is_file() and not (run_dir / METRICS_FILENAME).is_file():
        raise StoreError(f"{run_dir} has neither {store_path.name} nor {METRICS_FILENAME}")
    metrics, evals, samples, run_id, written_at = [], [], [], run_dir.name, None
    if store_path.is_file():
        with RolloutStore(store_path, readonly=True) as store:
            run_id = store.run_id
            metrics, evals = store.metrics(), store.evals()
            samples = _samples(store, steps)
            written_at = tuple(store.query("SELECT min(written_at), max(written_at) FROM steps")[1][0])
    if not any(len(row) > 1 for row in metrics):
        metrics = _read_metrics_jsonl(run_dir / METRICS_FILENAME)
    curves = _curves(metrics, evals)
    summary = run_summary(run_dir, metrics, evals, written_at)
    return _page(run_dir.name, run_id, curves, samples, summary)


def write_page(path: Path, page: str) -> None:
    """Write ``page`` to ``path`` through a temporary file beside it and a rename; on any failure the temporary
    file is removed and ``path`` is as it was (an OSError names ``path``)."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(page, encoding="utf-8")
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        if isinstance(exc, OSError) and exc.errno is not None:  # name the report, not its temporary file
            raise type(exc)(exc.errno, exc.strerror, str(path)) from exc
        raise


def _read_metrics_jsonl(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:  # blank, or the last line torn by a kill mid-write
            continue
        if isinstance(row, dict) and "step" in row:
            rows.append(row)
    return rows


def _numeric(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _curves(metrics: list[dict], evals: list[dict]) -> dict[str, dict[str, Series]]:
    """{chart title: {series name: [(step, value), ...]}} for the charts that have data.

    Eval values come from the store's evals, or from the metric rows' eval/ names when it has none
    (metrics.jsonl holds both, under the same names)."""
    series: dict[str, Series] = {}
    kinds: dict[str, str] = {}  # label -> the name CHARTS' patterns are matched against
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
    curves: dict[str, dict[str, Series]] = {}
    placed = {name for name in series if is_count(name)}
    for title, patterns in CHARTS:
        chosen = {
            name: sorted(points)
            for pattern in patterns
            for name, points in sorted(series.items())
            if name not in placed and _matches(kinds[name], pattern)
        }
        placed |= chosen.keys()
        if chosen:
            curves[title] = chosen
    return curves


def _matches(name: str, pattern: str) -> bool:
    """``pattern`` with one optional "*" standing for any non-empty text."""
    if "*" not in pattern:
        return name == pattern
    prefix, suffix = pattern.split("*")
    return name.startswith(prefix) and name.endswith(suffix) and len(name) > len(prefix + suffix)


def _samples(store: RolloutStore, steps: list[int] | None) -> list[dict]:
    """[{"step", "best", "worst"}] for the chosen steps that have rewarded rollouts."""
    if steps is None:
        with_rollouts = [row["step"] for row in store.summary() if row["n"]]
        if not with_rollouts:
            return []
        steps = sorted({with_rollouts[0], with_rollouts[len(with_rollouts) // 2], with_rollouts[-1]})
    samples = []
    for step in steps:
        best = store.rollouts(step=step, order_by_reward="desc", limit=1)
        worst = store.rollouts(step=step, order_by_reward="asc", limit=1)
        if best:
            samples.append({"step": step, "best": best[0], "worst": worst[0]})
    return samples


def _page(title: str, run_id: str, curves: dict[str, dict[str, Series]], samples: list[dict], summary: dict) -> str:
    charts = "\n".join(line_chart(name, series) for name, series in curves.items())
    data = {
        chart: {name: [list(p) for p in points] for name, points in series.items()} for chart, series in curves.items()
    }
    # "</" inside a script element would end it early; "<\/" is the same JSON string.
    data_json = json.dumps(data).replace("</", "<\\/")
    summary_json = json.dumps(summary).replace("</", "<\\/")
    sample_html = "\n".join(_sample_section(s) for s in samples) or "<p>No rollouts stored.</p>"
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>grpokit report: {escape(title)}</title>
<style>{_STYLE}</style>
<script type="application/json" id="grpokit-data">{data_json}</script>
<script type="application/json" id="grpokit-summary">{summary_json}</script>
</head><body>
<h1>grpokit report: {escape(title)}</h1>
<p class="meta">run {escape(run_id)} · generated {time.strftime("%Y-%m-%d %H:%M:%S")}</p>
{summary_html(summary)}
<h2>Curves</h2>
<div class="charts">
{charts or "<p>No metrics logged.</p>"}
</div>
<h2>Best and worst completions</h2>
{sample_html}
</body></html>
"""


def _sample_section(sample: dict) -> str:
    return (
        f"<h3>Step {sample['step']}</h3>\n"
        + _rollout_html(sample["best"], "best")
        + "\n"
        + _rollout_html(sample["worst"], "worst")
    )


def _fmt(value) -> str:
    return "-" if value is None else f"{value:.4g}"


def _rollout_html(rollout: dict, kind: str) -> str:
    rewards = ", ".join(f"{escape(name)} {_fmt(v)}" for name, v in sorted(rollout["rewards"].items()))
    error = f'<div class="error">error: {escape(rollout["error"])}</div>' if rollout["error"] is not None else ""
    # log_extra columns (the code reward's per-test results: code_tests), as `grpokit inspect` shows them
    extra = "".join(
        f'<div class="extra">{escape(column)}: {escape(json.dumps(value, default=str))}</div>'
        for column, value in sorted((rollout.get("extra") or {}).items())
    )
    return (
        f'<div class="sample {kind}"><b>{kind}</b>: reward {_fmt(rollout["reward"])} '
        f"({rewards}) · advantage {_fmt(rollout['advantage'])} · "
        f"{rollout['completion_tokens']} tokens · {escape(rollout['finish_reason'])} · "
        f"prompt {rollout['prompt_index']} #{rollout['completion_index']}"
        f'<pre class="prompt">{escape(rollout["prompt"])}</pre>'
        f"{_completion_html(rollout)}{extra}{error}</div>"
    )


def _completion_html(rollout: dict) -> str:
    """The completion; a multi-turn rollout as its conversation (each turn, each tool call and its result)."""
    conversation = rollout.get("conversation")
    if not conversation:
        return f'<pre class="completion">{escape(rollout["completion"])}</pre>'
    parts = []
    for turn in conversation["turns"]:
        if turn["role"] == "tool":
            arguments = json.dumps(turn.get("arguments") or {}, ensure_ascii=False)
            head = f"tool {turn.get('name')}({arguments}) -> {turn.get('status')}"
            if "duration" in turn:
                head += f", {turn['duration']:.3g} s"
            error = f"\nerror: {turn['error']}" if turn.get("error") else ""
            parts.append(f'<pre class="tool">{escape(head)}\n{escape(turn["text"])}{escape(error)}</pre>')
        else:
            parts.append(f'<pre class="completion">{escape(turn["text"])}</pre>')
    rounds = conversation["tool_rounds"]
    ended = f"ended: {conversation['stop_reason']} after {rounds} tool round{'s' * (rounds != 1)}"
    return "".join(parts) + f'<div class="meta">{escape(ended)}</div>'
