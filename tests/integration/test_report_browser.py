"""The report as a browser draws it: headless Chromium lays out report.html of a run with the demo's
shape of results (held-out pass@1 0.31 -> 0.96 over 100 steps), and the test reads the real geometry.

Needs a Chromium binary (Debian: `apt-get install chromium`, which `make test` does where it can);
skipped, with that reason, where there is none.
"""

from __future__ import annotations

import json
import math
import re
import sys
from itertools import combinations
from pathlib import Path

import pytest
import yaml

from grpokit.store import RolloutStore, write_report

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import screenshot_report

try:
    screenshot_report.find_chromium()
except SystemExit as exc:
    pytest.skip(f"headless report check needs Chromium: {exc}", allow_module_level=True)

EVAL_STEPS = (0, 25, 50, 75, 100)
PASS1 = (0.31, 0.62, 0.81, 0.90, 0.96)
PASS8 = (0.78, 0.93, 0.98, 1.0, 1.0)
GREEDY = (0.35, 0.70, 0.88, 0.93, 0.97)
EVAL_REWARD = (0.41, 0.66, 0.83, 0.91, 0.966)

# Collects, for every chart, its title, the plot frame, each line's name and box, and each legend
# entry's box, into <pre id="probe"> (read back through --dump-dom).
PROBE = """<pre id="probe"></pre><script>
const box = e => { const b = e.getBBox(); return [b.x, b.y, b.width, b.height]; };
const charts = [...document.querySelectorAll("svg.chart")].map(svg => ({
  title: svg.querySelector(".title").textContent,
  width: svg.width.baseVal.value,
  frame: box(svg.querySelector("rect.frame")),
  lines: [...svg.querySelectorAll("polyline")].map(p => ({name: p.querySelector("title").textContent, box: box(p)})),
  legend: [...svg.querySelectorAll("text.legend")].map(t => ({name: t.textContent, box: box(t)})),
}));
document.getElementById("probe").textContent = JSON.stringify(charts);
</script>"""


def demo_shaped_run(run: Path) -> None:
    run.mkdir()
    (run / "config.yaml").write_text(
        yaml.safe_dump(
            {
                "model": {"model_name_or_path": "demo-policy-v1"},
                "algo": {"loss_type": "dapo", "beta": 0.0},
                "optim": {"max_steps": 100},
            }
        )
    )
    with RolloutStore(run) as store:
        for step in range(0, 101):
            if step:
                reward = 0.45 + 0.5 * step / 100 + 0.03 * math.sin(step)
                store.write_step(
                    step,
                    [],
                    {
                        "reward": reward,
                        "rewards/arithmetic_correct/mean": reward - 0.1,
                        "rewards/arithmetic_format/mean": 1.0,
                        "kl": 0.0,
                        "entropy": 1.2 - step / 200,
                        "step_time": 1.5,
                    },
                )
            if step in EVAL_STEPS:
                i = EVAL_STEPS.index(step)
                store.write_eval(
                    step,
                    "eval",
                    {
                        "eval/reward": EVAL_REWARD[i],
                        "eval/num_prompts": 100.0,
                        "eval/pass@1": PASS1[i],
                        "eval/pass@8": PASS8[i],
                        "eval/greedy_accuracy": GREEDY[i],
                    },
                )


def overlap(a: list[float], b: list[float]) -> bool:
    return a[0] < b[0] + b[2] and b[0] < a[0] + a[2] and a[1] < b[1] + b[3] and b[1] < a[1] + a[3]


def test_eval_curves_fill_their_panels_and_legends_do_not_overlap(tmp_path):
    run = tmp_path / "run"
    demo_shaped_run(run)
    html = write_report(run)
    probe = tmp_path / "probe.html"
    probe.write_text(html.read_text().replace("</body>", PROBE + "</body>"))
    dom = screenshot_report.dump_dom(probe)
    charts = {c["title"]: c for c in json.loads(re.search(r'<pre id="probe">(.*?)</pre>', dom, re.DOTALL).group(1))}

    fractions = charts["Eval: pass@k and greedy accuracy (fraction of prompts)"]
    assert [line["name"] for line in fractions["lines"]] == ["eval/pass@1", "eval/pass@8", "eval/greedy_accuracy"]
    assert [line["name"] for line in charts["Eval: mean reward"]["lines"]] == ["eval/reward"]
    drawn = [line["name"] for chart in charts.values() for line in chart["lines"]]
    assert not any("num_prompts" in name for name in drawn)  # a count never shares an axis with fractions
    assert not any(name.count("eval/") > 1 for name in drawn)
    for title in ("Eval: pass@k and greedy accuracy (fraction of prompts)", "Eval: mean reward"):
        chart = charts[title]
        _fx, fy, fw, fh = chart["frame"]
        for line in chart["lines"]:
            _x, y, w, h = line["box"]
            assert fy - 1 <= y and y + h <= fy + fh + 1, (title, line)  # inside the plot
            # pass@1 rose 0.65 on an axis from about 0.28 to 1.03: the line spans most of the panel's height,
            # pass@8 (0.22 of it) still a visible part
            assert h / fh >= 0.25, (title, line, fh)
            assert w / fw >= 0.99, (title, line, fw)  # step 0 to step 100
    pass1 = next(line for line in fractions["lines"] if line["name"] == "eval/pass@1")
    assert pass1["box"][3] / fractions["frame"][3] >= 0.8
    for chart in charts.values():
        boxes = [entry["box"] for entry in chart["legend"]]
        assert all(b[0] + b[2] <= chart["width"] for b in boxes), chart["title"]
        assert not any(overlap(a, b) for a, b in combinations(boxes, 2)), chart["title"]

    png = tmp_path / "report.png"
    screenshot_report.screenshot(html, png, height=1600)
    assert png.stat().st_size > 10_000


def test_summary_opens_the_report_with_the_first_and_last_eval_values(tmp_path):
    run = tmp_path / "run"
    demo_shaped_run(run)
    html = write_report(run).read_text()
    assert html.index('<section class="summary">') < html.index("<h2>Curves</h2>")
    summary = json.loads(re.search(r'id="grpokit-summary">(.*?)</script>', html).group(1))
    assert summary["model"] == "demo-policy-v1" and summary["steps"] == 100 and summary["max_steps"] == 100
    assert summary["algorithm"] == {"loss_type": "dapo", "beta": 0.0}
    assert summary["counts"] == {"eval/num_prompts": 100.0}
    changes = {c["name"]: c for c in summary["changes"]}
    assert changes["eval/pass@1"] == {
        "name": "eval/pass@1",
        "first_step": 0,
        "first": 0.31,
        "last_step": 100,
        "last": 0.96,
        "change": pytest.approx(0.65),
    }
    assert changes["eval/reward"]["change"] == pytest.approx(0.556)
    # the store's step timestamps were written within this test; step 1's 1.5 s step_time is added
    assert 1.5 <= summary["wall_seconds"] < 60
    row = re.search(r"<tr><td>eval/pass@1</td>(.*?)</tr>", html).group(1)
    assert "0.31" in row and "0.96" in row and ">+0.65<" in row
