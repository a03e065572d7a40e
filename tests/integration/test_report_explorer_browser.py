"""The run explorer as headless Chromium opens it from file://: no console message of any kind, the tabs, the
Groups view's step picker (?step=N), the held-out categories, the Prompts view's rows and cells against the store,
and at most 6 lines per panel; screenshots of each
view are written (docs/runs.md's are made by scripts/report_screenshots.py the same way).

Needs a Chromium binary (Debian: `apt-get install chromium`); skipped, with that reason, where there is none.
"""

from __future__ import annotations

import re
import sqlite3
import sys
from pathlib import Path

import pytest

from grpokit.cli import main
from grpokit.store import write_report

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import screenshot_report
from synthetic_run import write_prompt_run, write_synthetic_run

try:
    screenshot_report.find_chromium()
except SystemExit as exc:
    pytest.skip(f"headless report check needs Chromium: {exc}", allow_module_level=True)


@pytest.fixture(scope="module")
def page(tmp_path_factory) -> Path:
    run = write_synthetic_run(tmp_path_factory.mktemp("explorer") / "run", steps=60, groups=4, group_size=6)
    return write_report(run)


def shown(dom: str, section: str) -> bool:
    tag = re.search(rf'<section id="{section}" class="([^"]*)"', dom).group(1)
    return "hide" not in tag.split()


def test_opens_with_no_console_messages_and_tabs(page):
    dom, console = screenshot_report.open_page(page.resolve().as_uri())
    assert console == []
    tabs = re.findall(r'<button type="button" data-view="(\w+)"[^>]*>(.*?)</button>', dom)
    assert tabs == [
        ("curves", "Curves"),
        ("groups", "Groups"),
        ("heldout", "Held-out prompts"),
        ("prompts", "Prompts"),
        ("tokens", "Tokens"),
        ("samples", "Best and worst completions"),
    ]
    assert shown(dom, "curves") and not shown(dom, "groups") and not shown(dom, "heldout")
    for svg in re.findall(r"<svg.*?</svg>", dom, re.DOTALL):
        assert 1 <= svg.count("<polyline") <= 6
    titles = re.findall(r'<text x="\d+" y="18" class="title">(.*?)</text>', dom)
    for family in ("Loss and its terms", "Gradient norm", "Phase times (s): sampling, scoring, learning, syncing",
                   "Tokens per second", "Clipped fraction by region", "Reward",
                   "Groups: zero reward variance, all correct, all wrong (fraction)"):  # fmt: skip
        assert family in titles, family
    assert "Prompts truncated or dropped (so far)" not in titles  # all 0 in this run: nothing to show


def test_step_picker_opens_the_step_asked_for(page):
    dom, console = screenshot_report.open_page(page.resolve().as_uri() + "?step=31")
    assert console == []
    assert shown(dom, "groups") and not shown(dom, "curves")
    blocks = {step: bool(hide) for hide, step in re.findall(r'<div class="group-step( hide)?" data-step="(\d+)"', dom)}
    assert [step for step, hidden in blocks.items() if not hidden] == ["31"] and {"1", "60"} <= set(blocks)
    dom, console = screenshot_report.open_page(page.resolve().as_uri() + "?step=7777")
    assert console == [] and "step 7777 is not in this page: grpokit report RUN --steps 7777 adds it" in dom


def test_held_out_view_lists_every_category(page):
    dom, console = screenshot_report.open_page(page.resolve().as_uri() + "?view=heldout")
    assert console == [] and shown(dom, "heldout") and not shown(dom, "curves")
    buttons = re.findall(r'<button type="button" data-category="([^"]+)"', dom)
    assert buttons == ["all", "learned", "forgotten", "never solved", "kept"]
    counts = re.search(r"(\d+) learned, (\d+) forgotten, (\d+) never solved, (\d+) kept", dom).groups()
    assert sum(map(int, counts)) == 100


def test_prompts_view_shows_each_prompts_pass_rate_by_step_from_the_store(tmp_path):
    run = write_prompt_run(tmp_path / "run")
    dom, console = screenshot_report.open_page(write_report(run).resolve().as_uri() + "?view=prompts")
    assert console == [] and shown(dom, "prompts") and not shown(dom, "curves")
    view = re.search(r'<section id="prompts" class="view">.*?</section>', dom, re.DOTALL).group(0)
    with sqlite3.connect(run / "rollouts.sqlite") as db:
        steps = [s for (s,) in db.execute("SELECT DISTINCT step FROM rollouts ORDER BY step")]
        cells = {
            (i, s): (passed, n)
            for i, s, passed, n in db.execute(
                "SELECT prompt_index, step, sum(reward >= 1.0), count(*) FROM rollouts GROUP BY prompt_index, step"
            )
        }
        sampled = dict(db.execute("SELECT prompt_index, samples FROM prompt_history"))
        retired = {i for (i,) in db.execute("SELECT prompt_index FROM prompt_history WHERE solved_streak >= 2")}
    db.close()
    rows = re.findall(r'<tr data-prompt="(\d+)"( class="retired")?>(.*?)</tr>', view, re.DOTALL)
    # learned (recent pass rate over 4 completions >= 0.75) at step 2: prompts 0 and 2, at step 4: 1; never: 4, 3
    assert [int(i) for i, _, _ in rows] == [0, 2, 1, 4, 3]
    assert {int(i) for i, r, _ in rows if r} == retired == {0}  # retire_after 2: solved at steps 2 and 3
    for index, _, row in rows:
        tds = re.findall(r"<td( class=\"h\d\" title=\"[^\"]*\")?>([^<]*)</td>", row)
        assert int(tds[2][1]) == sampled[int(index)]  # learned at, visits, samples, ...
        drawn = [re.search(r"(\d+)/(\d+) passed", t).groups() if t else None for t, _ in tds[4:]]
        expected = [cells.get((int(index), s)) for s in steps]
        assert [tuple(map(int, d)) if d else None for d in drawn] == expected, index
    png = tmp_path / "prompts.png"
    screenshot_report.screenshot(run / "report.html", png, height=900, suffix="?view=prompts")
    assert png.stat().st_size > 5_000


def test_readable_without_javascript(page):
    html = page.read_text()
    # every view is in the page as plain HTML, none hidden; the controls the script fills are hidden until it runs
    for section in ("curves", "groups", "heldout", "prompts", "tokens", "samples"):
        assert f'<section id="{section}" class="view">' in html
    assert "hide" not in re.sub(r"<style>.*?</style>|<script>.*?</script>", "", html, flags=re.DOTALL)
    for control in ('id="group-controls" hidden', 'id="heldout-controls" hidden', 'placeholder="filter panels'):
        assert control in html
    assert re.search(r'<input id="panel-filter"[^>]* hidden>', html)


def test_screenshots_of_each_view(page, tmp_path):
    for name, suffix in (("curves", ""), ("groups", "?step=31"), ("heldout", "?view=heldout")):
        png = tmp_path / f"{name}.png"
        screenshot_report.screenshot(page, png, height=1400, suffix=suffix)
        assert png.stat().st_size > 10_000, name


def test_compare_page_opens_with_no_console_messages(page, tmp_path):
    other = write_synthetic_run(
        tmp_path / "other", steps=40, groups=4, group_size=6, seed=3, config={"algo": {"beta": 0}}
    )
    out = tmp_path / "compare.html"
    assert main(["compare", str(page.parent), str(other), "-o", str(out)]) == 0
    dom, console = screenshot_report.open_page(out.resolve().as_uri())
    assert console == []
    assert "<td>algo.beta</td><td>0.04</td><td>0</td>" in dom
    # each overlaid metric twice (by step, by wall time), each run in its own colour on every chart
    titles = re.findall(r'<text x="\d+" y="18" class="title">(.*?)</text>', dom)
    assert titles.count("eval/pass@1") == 2 and titles.count("reward") == 2
    for svg in re.findall(r"<svg.*?</svg>", dom, re.DOTALL):
        assert re.findall(r'<polyline points="[^"]*" fill="none" stroke="(#\w+)"', svg) == ["#4e79a7", "#f28e2b"]
    screenshot_report.screenshot(out, tmp_path / "compare.png", height=1400)
    assert (tmp_path / "compare.png").stat().st_size > 10_000
