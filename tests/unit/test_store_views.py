"""What users see of a store: `grpokit inspect`, the HTML report and its SVG charts, the CLI."""

import json
import re
from html import escape

import pytest

from grpokit.cli import build_parser, main
from grpokit.store import RolloutRecord, RolloutStore, StoreError, inspect_run, write_report
from grpokit.store.svg import line_chart, nice_ticks

XSS = "<script>alert('x')</script> & [bold]not markup[/bold]"


def rollout(prompt_index, completion_index, reward, accuracy, tokens, error=None, text=None):
    return RolloutRecord(
        prompt_index=prompt_index,
        completion_index=completion_index,
        prompt=f"Q{prompt_index}?",
        completion=text or f"answer {prompt_index}.{completion_index}",
        prompt_tokens=4,
        completion_tokens=tokens,
        finish_reason="stop",
        rewards={"accuracy": accuracy, "format": None if error else 0.5},
        reward=reward,
        advantage=0.0,
        policy_version=0,
        error=error,
    )


@pytest.fixture
def run(tmp_path):
    """Three steps of two prompts x two completions; numbers chosen to check by hand.

    step 1 rewards 1.5, 0.5, 0.5, None (error) lengths 10, 20, 30, 40
    step 2 rewards 2.0, 0.0, 1.0, 0.5            lengths 5, 5, 5, 5
    step 3 rewards 0.25 (completion XSS), 1.75, 0.5, 0.5  lengths 8, 8, 8, 8
    """
    run_dir = tmp_path / "demo"
    with RolloutStore(run_dir) as store:
        store.write_step(
            1,
            [
                rollout(0, 0, 1.5, 1.0, 10),
                rollout(0, 1, 0.5, 0.0, 20),
                rollout(1, 0, 0.5, 0.0, 30),
                rollout(1, 1, None, None, 40, error="TimeoutError: 5 s"),
            ],
            {"reward": 0.8333, "rewards/accuracy/mean": 0.3333, "kl": 0.0, "learning_rate": 1e-6},
        )
        store.write_step(
            2,
            [
                rollout(0, 0, 2.0, 1.0, 5),
                rollout(0, 1, 0.0, 0.0, 5),
                rollout(1, 0, 1.0, 1.0, 5),
                rollout(1, 1, 0.5, 0.0, 5),
            ],
            {"reward": 0.875, "rewards/accuracy/mean": 0.5, "kl": 0.01, "learning_rate": 2e-6},
        )
        store.write_step(
            3,
            [
                rollout(0, 0, 0.25, 0.0, 8, text=XSS),
                rollout(0, 1, 1.75, 1.0, 8),
                rollout(1, 0, 0.5, 0.0, 8),
                rollout(1, 1, 0.5, 0.0, 8),
            ],
            {"reward": 0.75, "rewards/accuracy/mean": 0.25, "kl": 0.03, "learning_rate": 2e-6},
        )
        store.write_eval(2, "gsm8k", {"pass@1": 0.25, "pass@4": 0.5})
    return run_dir


def as_json(run_dir, **options):
    return json.loads(inspect_run(run_dir, as_json=True, **options))


# ----------------------------------------------------------------------------- inspect


def test_inspect_summary(run):
    # step 1: mean reward (1.5 + 0.5 + 0.5) / 3 = 0.8333, mean length 100 / 4 = 25, 1 error;
    # step 2: 3.5 / 4 = 0.875, 5; step 3: 3.0 / 4 = 0.75, 8.
    rows = as_json(run)
    assert [(r["step"], r["n"], r["errors"], r["mean_length"]) for r in rows] == [
        (1, 4, 1, 25.0),
        (2, 4, 0, 5.0),
        (3, 4, 0, 8.0),
    ]
    assert [r["mean_reward"] for r in rows] == pytest.approx([2.5 / 3, 0.875, 0.75])
    table = inspect_run(run)
    assert re.search(r"│\s+1 │\s+4 │\s+0\.8333 │\s+25 │\s+1 │", table)
    assert re.search(r"│\s+2 │\s+4 │\s+0\.875 │\s+5 │\s+0 │", table)


def test_inspect_step(run):
    rows = as_json(run, step=2)
    assert [(r["step"], r["prompt_index"], r["completion_index"], r["reward"]) for r in rows] == [
        (2, 0, 0, 2.0),
        (2, 0, 1, 0.0),
        (2, 1, 0, 1.0),
        (2, 1, 1, 0.5),
    ]


def test_inspect_top_and_bottom(run):
    # All rewards: 2.0 (s2), 1.75 (s3), 1.5 (s1), 1.0 (s2), ... lowest 0.0 (s2), then 0.25 (s3).
    assert [(r["step"], r["reward"]) for r in as_json(run, top=3)] == [(2, 2.0), (3, 1.75), (1, 1.5)]
    assert [(r["step"], r["reward"]) for r in as_json(run, bottom=2)] == [(2, 0.0), (3, 0.25)]
    assert [r["reward"] for r in as_json(run, step=3, top=1)] == [1.75]
    text = inspect_run(run, top=1)
    assert "step 2 · prompt 0 · #0 · reward 2 (accuracy 1, format 0.5)" in text


def test_inspect_prompt_and_errors(run):
    assert {(r["step"], r["prompt_index"]) for r in as_json(run, prompt=1)} == {(1, 1), (2, 1), (3, 1)}
    assert len(as_json(run, prompt=1)) == 6
    [err] = as_json(run, errors=True)
    assert (err["step"], err["prompt_index"], err["completion_index"]) == (1, 1, 1)
    assert err["error"] == "TimeoutError: 5 s" and err["rewards"] == {"accuracy": None, "format": None}
    assert "error: TimeoutError: 5 s" in inspect_run(run, errors=True)
    assert inspect_run(run, prompt=7) == "no completions match\n"


def test_inspect_prints_markup_literally(run):
    text = inspect_run(run, step=3, bottom=1)
    assert "[bold]not markup[/bold]" in text


def test_inspect_sql(run):
    rows = as_json(run, sql="SELECT step, sum(completion_tokens) AS tokens FROM rollouts GROUP BY step ORDER BY step")
    # 10 + 20 + 30 + 40 = 100; 4 x 5 = 20; 4 x 8 = 32
    assert rows == [{"step": 1, "tokens": 100}, {"step": 2, "tokens": 20}, {"step": 3, "tokens": 32}]
    assert re.search(r"│\s+1 │\s+100 │", inspect_run(run, sql="SELECT 1, 100"))


def test_inspect_errors_are_clear(run, tmp_path):
    with pytest.raises(StoreError, match="no run folder"):
        inspect_run(tmp_path / "nope")
    with pytest.raises(StoreError, match="no rollout store"):
        inspect_run(tmp_path)
    with pytest.raises(StoreError, match="either --top or --bottom"):
        inspect_run(run, top=1, bottom=1)
    with pytest.raises(StoreError, match="--sql cannot be combined"):
        inspect_run(run, sql="SELECT 1", step=1)
    with pytest.raises(StoreError, match="only a single SELECT"):
        inspect_run(run, sql="DELETE FROM rollouts")
    assert len(as_json(run, step=1)) == 4


def test_inspect_json_writes_nan_as_null(tmp_path):
    with RolloutStore(tmp_path / "r") as store:
        store.write_step(1, [], {"kl": float("nan")})
    assert as_json(tmp_path / "r", sql="SELECT step, value FROM step_metrics") == [{"step": 1, "value": None}]


# ----------------------------------------------------------------------------- report


def report_data(html: str) -> dict:
    match = re.search(r'<script type="application/json" id="grpokit-data">(.*?)</script>', html, re.DOTALL)
    return json.loads(match.group(1))


PASS_CHART = "Eval: pass@k and greedy accuracy (fraction of prompts)"
GROUPS_CHART = "Groups: zero reward variance, all correct, all wrong (fraction)"


def test_report_curves(run):
    path = write_report(run)
    assert path == run / "report.html"
    html = path.read_text()
    data = report_data(html)
    assert data["Reward"] == {
        "reward": [[1, 0.8333], [2, 0.875], [3, 0.75]],
        "rewards/accuracy/mean": [[1, 0.3333], [2, 0.5], [3, 0.25]],
    }
    assert data["KL to the reference"] == {"kl": [[1, 0.0], [2, 0.01], [3, 0.03]]}
    assert data["Learning rate"] == {"learning_rate": [[1, 1e-6], [2, 2e-6], [3, 2e-6]]}
    # an eval of another dataset than the trainer's "eval": the names as written, with the dataset
    assert data[PASS_CHART] == {"pass@1 (gsm8k)": [[2, 0.25]], "pass@4 (gsm8k)": [[2, 0.5]]}
    # From the store, threshold 1.0 (no config): step 1's prompt 1 has 0.5 only (its error left out), all wrong;
    # prompt 0 has 1.5 and 0.5, neither. Step 2: 2.0/0.0 and 1.0/0.5, neither. Step 3: 0.25/1.75, and 0.5/0.5.
    assert data[GROUPS_CHART] == {
        "groups/all_correct_fraction": [[1, 0.0], [2, 0.0], [3, 0.0]],
        "groups/all_wrong_fraction": [[1, 0.5], [2, 0.0], [3, 0.5]],
    }
    # Metrics the run did not log have no chart.
    assert set(data) == {"Reward", "KL to the reference", "Learning rate", PASS_CHART, GROUPS_CHART}
    assert html.count("<svg") == 5
    assert "Entropy" not in html


def test_report_samples_are_first_middle_last_and_escaped(run):
    html = write_report(run).read_text()
    assert [int(s) for s in re.findall(r"<h3>Step (\d+)</h3>", html)] == [1, 2, 3]
    # Step 3: best 1.75 is "answer 0.1", worst 0.25 is the XSS completion, shown escaped.
    step3 = html.split("<h3>Step 3</h3>")[1]
    assert "best</b>: reward 1.75" in step3 and "answer 0.1" in step3
    assert "worst</b>: reward 0.25" in step3
    assert escape(XSS) in step3
    assert "<script>alert" not in html
    # Step 1's worst is 0.5 (rewarded rollouts come before the unrewarded error one).
    assert "worst</b>: reward 0.5" in html.split("<h3>Step 1</h3>")[1].split("<h3>")[0]


def test_report_chosen_steps(run):
    html = write_report(run, steps=[2]).read_text()
    assert re.findall(r"<h3>Step (\d+)</h3>", html) == ["2"]
    assert "best</b>: reward 2 " in html and "worst</b>: reward 0 " in html


def test_report_is_self_contained(run):
    html = write_report(run).read_text()
    urls = set(re.findall(r"https?://[^\s\"'<>]+", html))
    assert urls == {"http://www.w3.org/2000/svg"}  # an XML namespace name, never fetched
    assert not re.search(r"\b(src|href)\s*=", html)
    # one inline script (tabs, filters), which fetches nothing
    scripts = re.findall(r"<script>(.*?)</script>", html.replace('<script type="application/json"', ""), re.DOTALL)
    assert len(scripts) == 1 and not re.search(r"fetch|XMLHttpRequest|import\(|WebSocket|src", scripts[0])


def test_report_falls_back_to_metrics_jsonl(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    lines = [
        {"step": 1, "reward": 0.5, "entropy": 2.0, "note": "text is skipped"},
        {"step": 2, "reward": 0.75, "entropy": 1.5},
    ]
    (run_dir / "metrics.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    data = report_data(write_report(run_dir).read_text())
    assert data == {"Reward": {"reward": [[1, 0.5], [2, 0.75]]}, "Entropy": {"entropy": [[1, 2.0], [2, 1.5]]}}
    # A store with rollouts but no step metrics also reads metrics.jsonl.
    with RolloutStore(run_dir) as store:
        store.write_step(1, [rollout(0, 0, 1.0, 1.0, 3)], {})
    html = write_report(run_dir).read_text()
    assert report_data(html)["Entropy"] == {"entropy": [[1, 2.0], [2, 1.5]]}
    assert "<h3>Step 1</h3>" in html


def test_report_errors(tmp_path):
    with pytest.raises(StoreError, match="no run folder"):
        write_report(tmp_path / "nope")
    with pytest.raises(StoreError, match=r"neither rollouts\.sqlite nor metrics\.jsonl"):
        write_report(tmp_path)


# ----------------------------------------------------------------------------- svg


def test_nice_ticks():
    # [0, 1] in ~5 ticks: raw step 1/4 = 0.25 -> magnitude 0.1 -> first of 0.1, 0.2, 0.5 >= 0.25.
    assert nice_ticks(0, 1) == [0, 0.5, 1.0]
    # [1, 60] in ~6: raw 59/5 = 11.8 -> 20; first multiple of 20 >= 1 is 20.
    assert nice_ticks(1, 60, count=6, min_step=1) == [20, 40, 60]
    # [1, 3]: raw 0.4, raised to min_step 1 -> integer steps.
    assert nice_ticks(1, 3, count=6, min_step=1) == [1, 2, 3]
    # [-0.013, 0.02]: raw 0.00825 -> magnitude 0.001 -> 0.01; from ceil(-1.3) * 0.01 = -0.01.
    assert nice_ticks(-0.013, 0.02) == pytest.approx([-0.01, 0.0, 0.01, 0.02])
    assert nice_ticks(2, 2) == [2]


def test_line_chart():
    assert line_chart("empty", {"a": []}) == ""
    svg = line_chart("T <1>", {"a": [(1, 0.0), (2, 1.0), (3, 0.5)], "b": [(2, 0.25)]})
    polylines = re.findall(r'<polyline points="([^"]+)"', svg)
    assert [len(p.split()) for p in polylines] == [3, 1]
    # x spans steps 1..3 over the plot's 480 px from x = 64: step 2 sits in the middle, 304.
    assert polylines[0].split()[1].startswith("304.0,")
    assert "T &lt;1&gt;" in svg and svg.count("<circle") == 4


# ----------------------------------------------------------------------------- cli


def parser():
    return build_parser()


def test_cli_inspect(run, capsys):
    args = parser().parse_args(["inspect", str(run), "--top", "2", "--step", "2", "--json"])
    assert args.func(args) == 0
    assert [r["reward"] for r in json.loads(capsys.readouterr().out)] == [2.0, 1.0]


def test_cli_inspect_errors(run, tmp_path, capsys):
    assert main(["inspect", str(tmp_path / "nope")]) == 2
    assert capsys.readouterr().err == f"grpokit: error: no run folder at {tmp_path / 'nope'}\n"
    assert main(["inspect", str(run), "--sql", "SELECT * FROM nope"]) == 2
    assert "no such table: nope" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        parser().parse_args(["inspect", str(run), "--top", "1", "--bottom", "1"])
    assert exc.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err


def test_cli_report(run, capsys):
    args = parser().parse_args(["report", str(run)])
    assert args.func(args) == 0
    assert (run / "report.html").is_file()
    assert f"wrote {run / 'report.html'}" in capsys.readouterr().out
