"""`grpokit report RUN`: RUN/report.html, one self-contained page exploring a run: a summary (model, algorithm,
steps, wall time, first and last eval values, their change coloured where a direction is good), a panel per
logged metric family (store/panels.py), each group's completions side by side (store/groups.py), the held-out
prompts learned, forgotten or never solved (store/heldout.py), each training prompt's pass rate across steps
(store/prompts_view.py), and the best and worst completions.

The page needs no network (a vision-language run's thumbnails are its RUN/images files, linked by a path relative to
the page) and reads without JavaScript: charts are inline SVG, styles inline CSS, and a small
inline script (store/page.py) adds tabs and filters. The curves' numbers and the summary are also embedded as
JSON (`<script type="application/json">` elements `grpokit-data` and `grpokit-summary`) so they can be read back
without parsing the page. Series are labelled with the metric names as logged.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from urllib.parse import quote

from grpokit.store.groups import group_fractions, group_steps, groups_html, success_threshold
from grpokit.store.heldout import eval_prompts, heldout_html
from grpokit.store.images import FOLDER
from grpokit.store.page import page
from grpokit.store.panels import collect_series, panels, thin
from grpokit.store.prompts_view import prompts_html
from grpokit.store.samples import best_and_worst, samples_html
from grpokit.store.store import RolloutStore, StoreError, resolve_store_path
from grpokit.store.summary import run_summary, summary_html
from grpokit.store.svg import line_chart
from grpokit.store.thumbs import known_images
from grpokit.store.tokens import tokens_html

REPORT_FILENAME = "report.html"
_WRITTEN_AT = "SELECT min(written_at), max(written_at) FROM steps WHERE typeof(written_at) IN ('real', 'integer')"
METRICS_FILENAME = "metrics.jsonl"


def write_report(run_dir: str | Path, steps: list[int] | None = None, output: str | Path | None = None) -> Path:
    """Write RUN/report.html (or ``output``) and return its path.

    Curves come from the store's step metrics, or from RUN/metrics.jsonl when the store has none;
    metrics a run did not log are skipped. The Groups view and the best and worst completions show `steps`,
    by default the first, middle and last step with rollouts (the Groups view: and evenly spaced others). The page
    is written to a temporary file beside it, then renamed: a stop or a full disk while writing leaves the previous
    report whole.
    """
    path = Path(output) if output is not None else Path(run_dir) / REPORT_FILENAME
    write_page(path, report_page(run_dir, steps, path.parent))
    return path


def images_url(run_dir: Path, page_dir: Path | None) -> str:
    """The URL of the run's images folder from a page in ``page_dir`` (None: the run folder): relative, so the page
    and its run folder can move together; a file:// URL where no relative path exists (another drive)."""
    folder = (Path(run_dir) / FOLDER).resolve()
    try:
        relative = os.path.relpath(folder, Path(page_dir or run_dir).resolve())
    except ValueError:
        return folder.as_uri()
    return quote(Path(relative).as_posix())


def report_page(run_dir: str | Path, steps: list[int] | None = None, page_dir: str | Path | None = None) -> str:
    """The report of the run in ``run_dir`` as one HTML page (see :func:`write_report`; ``page_dir``: the folder it
    goes to, by default the run folder: its images are linked from there); reads only."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise StoreError(f"no run folder at {run_dir}")
    store_path = resolve_store_path(run_dir)
    if not store_path.is_file() and not (run_dir / METRICS_FILENAME).is_file():
        raise StoreError(f"{run_dir} has neither {store_path.name} nor {METRICS_FILENAME}")
    metrics, evals, run_id, written_at, views = [], [], run_dir.name, None, []
    samples_section = samples_html([])
    derived: list[dict] = []
    problems: list[str] = []
    if store_path.is_file():
        with RolloutStore(store_path, readonly=True) as store:
            run_id = store.run_id
            metrics, evals = store.metrics(), store.evals()
            with_rollouts = [row["step"] for row in store.summary() if row["n"]]
            derived = group_fractions(store, success_threshold(run_dir))
            url = images_url(run_dir, page_dir)
            views.append(groups_html(store, group_steps(with_rollouts, steps), images_url=url))
            views.append(heldout_html(eval_prompts(store), url, store))
            views.append(prompts_html(store, run_dir))
            views.append(tokens_html(store, steps, url))
            chosen = best_and_worst(store, _sample_steps(with_rollouts, steps))
            known = known_images(store, [s[kind].get("images") for s in chosen for kind in ("best", "worst")])
            samples_section = samples_html(chosen, url, known)
            written_at = tuple(store.query(_WRITTEN_AT)[1][0])
            problems = store.problems()
    if not any(len(row) > 1 for row in metrics):
        metrics = _read_metrics_jsonl(run_dir / METRICS_FILENAME)
    series, kinds = collect_series(metrics + derived, evals)
    curves = panels(series, kinds)
    summary = run_summary(run_dir, metrics, evals, written_at)
    charts = "\n".join(line_chart(name, {n: thin(p) for n, p in lines.items()}) for name, lines in curves.items())
    data = {
        chart: {name: [list(p) for p in points] for name, points in lines.items()} for chart, lines in curves.items()
    }
    views.append(samples_section)
    return page(run_dir.name, run_id, summary_html(summary), charts, data, summary, views, problems)


def _sample_steps(with_rollouts: list[int], steps: list[int] | None) -> list[int]:
    """The best-and-worst section's steps: ``steps``, else the first, middle and last with rollouts."""
    if steps is not None:
        return steps
    if not with_rollouts:
        return []
    return sorted({with_rollouts[0], with_rollouts[len(with_rollouts) // 2], with_rollouts[-1]})


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
        if isinstance(row, dict) and isinstance(row.get("step"), int) and not isinstance(row["step"], bool):
            rows.append(row)
    return rows
