"""report.html as a run explorer: panels per metric family, the change column's colours, the Groups view, the
held-out prompts, and the page size of a long run. Numbers worked by hand in the comments."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from grpokit.cli import main
from grpokit.store import RolloutRecord, RolloutStore, write_report
from grpokit.store.directions import change_class, direction
from grpokit.store.groups import group_steps, zero_variance
from grpokit.store.heldout import categorize, category, eval_prompts
from grpokit.store.panels import MAX_SERIES, collect_series, panels, thin

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
from synthetic_run import write_synthetic_run


def curves(rows: list[dict], evals: list[dict] | None = None) -> dict:
    return panels(*collect_series(rows, evals or []))


def test_each_family_gets_its_panel_one_kind_per_chart():
    rows = [
        {"step": s, "loss": 0.1, "policy_loss": 0.09, "grad_norm": 1.0, "entropy": 1.0, "time/generate": 0.5,
         "step_time": 1.0, "tokens_per_second": 100.0, "frac_reward_zero_std": 0.25, "my_metric": 3.0}
        for s in (1, 2)
    ]  # fmt: skip
    panel = curves(rows)
    assert set(panel["Loss and its terms"]) == {"loss", "policy_loss"}
    assert set(panel["Gradient norm"]) == {"grad_norm"}
    assert set(panel["Phase times (s): sampling, scoring, learning, syncing"]) == {"step_time", "time/generate"}
    assert set(panel["Tokens per second"]) == {"tokens_per_second"}
    assert set(panel["Groups: zero reward variance, all correct, all wrong (fraction)"]) == {"frac_reward_zero_std"}
    assert set(panel["my_metric"]) == {"my_metric"}  # a name no family knows: a panel of its own
    assert sum(len(lines) for lines in panel.values()) == 9  # every metric on exactly one panel


def test_no_panel_holds_more_than_six_series():
    # 8 reward functions + the total: 9 means, on two panels of 6 and 3
    rows = [{"step": 1, "reward": 1.0, **{f"rewards/f{i}/mean": i / 10 for i in range(8)}}]
    panel = curves(rows)
    assert [len(panel["Reward (1/2)"]), len(panel["Reward (2/2)"])] == [MAX_SERIES, 3]
    assert "Reward" not in panel


def test_panels_of_nothing_are_left_out_and_counts_never_drawn():
    rows = [{"step": s, "clip_ratio/low_mean": 0.0, "clip_ratio/high_mean": 0.0, "kl": 0.0, "entropy": 0.0}
            for s in (1, 2)]  # fmt: skip
    panel = curves(rows, [{"step": 0, "dataset": "eval", "eval/num_prompts": 100.0, "eval/pass@1": 0.5}])
    assert set(panel) == {"Entropy", "Eval: pass@k and greedy accuracy (fraction of prompts)"}
    # one clipped token somewhere: the clip panel is back, with every region
    rows[1]["clip_ratio/high_mean"] = 0.01
    assert set(curves(rows)["Clipped fraction by region"]) == {"clip_ratio/low_mean", "clip_ratio/high_mean"}


def test_eval_metrics_go_to_their_family_with_an_eval_title():
    evals = [{"step": 0, "dataset": "eval", "eval/completion_length/mean": 3.0, "eval/entropy": 1.0},
             {"step": 0, "dataset": "math", "eval/entropy": 2.0}]  # fmt: skip
    panel = curves([], evals)
    assert panel["Eval: Completion length (tokens)"] == {"eval/completion_length/mean": [(0, 3.0)]}
    assert panel["Eval: Entropy"] == {"eval/entropy": [(0, 1.0)], "eval/entropy (math)": [(0, 2.0)]}


def test_change_colour_only_where_a_direction_is_good():
    assert change_class("eval/pass@1", 0.65) == "good" and change_class("eval/pass@1", -0.1) == "bad"
    assert change_class("pass@1 (gsm8k)", 0.1) == "good"
    assert change_class("reward", -0.2) == "bad"
    assert change_class("groups/all_wrong_fraction", -0.3) == "good"
    assert change_class("eval/rewards/acc/errors", 1.0) == "bad"
    assert change_class("eval/truncated_fraction", 0.1) == "bad"
    # zero-variance groups rise both when a run stops exploring and when it solves every prompt
    for neutral in (
        "entropy",
        "eval/entropy",
        "loss",
        "kl",
        "completion_length/mean",
        "grad_norm",
        "frac_reward_zero_std",
    ):
        assert direction(neutral) == 0 and change_class(neutral, -0.5) == "" == change_class(neutral, 0.5)
    assert change_class("reward", 0.0) == ""


def test_summary_table_colours_by_direction(tmp_path):
    run = tmp_path / "run"
    with RolloutStore(run) as store:
        for step in (1, 2):
            store.write_step(step, [], {"reward": step / 4})
        for step, entropy, zero in ((0, 1.2, 0.5), (2, 0.7, 0.2)):
            store.write_eval(step, "eval", {"eval/entropy": entropy, "eval/frac_reward_zero_std": zero})
    html = write_report(run).read_text()
    assert re.search(r"<td>eval/entropy</td>.*?<td class=\"\">-0.5</td>", html)  # falling entropy: neutral
    assert re.search(r"<td>eval/frac_reward_zero_std</td>.*?<td class=\"\">-0.3</td>", html)
    # reward (a direction) first; entropy and zero-variance groups folded below
    assert html.index("<td>reward</td>") < html.index("<details><summary>2 other metrics</summary>")
    assert html.index("<details><summary>2 other metrics") < html.index("<td>eval/entropy</td>")
    assert re.search(r"<td>reward</td>.*?<td class=\"good\">\+0.25</td>", html)


def test_group_steps_first_middle_last_and_spaced():
    assert group_steps([]) == []
    assert group_steps([3, 4, 5]) == [3, 4, 5]
    steps = list(range(1, 101))
    chosen = group_steps(steps, most=6)
    # 5 spaced over indices 0..99: 0, 24.75 -> 25, 49.5 -> 50 (round half to even), 74.25 -> 74, 99; middle 50
    assert chosen == [1, 26, 51, 75, 100]
    assert group_steps(steps, chosen=[7, 500, 3]) == [3, 7]  # asked for; 500 has no rollouts


def test_zero_variance_groups():
    assert zero_variance([1.0, 1.0, 1.0]) and zero_variance([None, 0.5, 0.5]) and zero_variance([None, None])
    assert not zero_variance([1.0, 0.0])


def test_held_out_categories():
    # solved: at least half the samples correct
    assert category([(0, 8), (4, 8)]) == "learned"
    assert category([(5, 8), (8, 8)]) == "kept"
    assert category([(0, 8), (8, 8), (3, 8)]) == "forgotten"
    assert category([(3, 8), (3, 8)]) == "never solved"
    assert category([(4, 8), (0, 8), (4, 8)]) == "kept"  # solved at the first and the last


def test_thin_keeps_extremes():
    points = [(s, float(s % 7)) for s in range(2000)]
    points[1234] = (1234, 99.0)
    thinned = thin(points, most=100)
    assert len(thinned) <= 100 and (1234, 99.0) in thinned and min(v for _, v in thinned) == 0.0
    assert [x for x, _ in thinned] == sorted(x for x, _ in thinned)
    assert thin(points[:50]) == points[:50]


def record(prompt_index, completion_index, reward, advantage):
    return RolloutRecord(
        prompt_index=prompt_index,
        completion_index=completion_index,
        prompt=f"Q{prompt_index}",
        completion=f"<b>answer</b> {completion_index}",
        prompt_tokens=2,
        completion_tokens=3 + completion_index,
        finish_reason="length" if completion_index == 2 else "stop",
        rewards={"correct": reward, "format": 0.5},
        reward=reward,
        advantage=advantage,
        policy_version=0,
    )


def test_groups_view_shows_each_group_side_by_side(tmp_path):
    run = tmp_path / "run"
    with RolloutStore(run) as store:
        # prompt 0: rewards 1, 0, 1 (advantages from the group); prompt 1: all 1, a zero-variance group
        group0 = [record(0, 0, 1.0, 0.577), record(0, 1, 0.0, -1.155), record(0, 2, 1.0, 0.577)]
        group1 = [record(1, i, 1.0, 0.0) for i in range(3)]
        store.write_step(1, group0 + group1, {"reward": 5 / 6})
    html = write_report(run).read_text()
    view = html.split('<section id="groups"')[1].split("</section>")[0]
    assert "2 groups; 1 with zero reward variance" in view
    found = re.findall(r'<div class="group( flat)?">(.*?)</table>', view, re.DOTALL)
    assert [flat for flat, _ in found] == ["", " flat"]
    groups = [body for _, body in found]
    assert "zero variance" in groups[1] and "zero variance" not in groups[0]
    cells = lambda label, g: re.findall(
        r"<td>(.*?)</td>", g.split(f'<th scope="row">{label}</th>')[1].split("</tr>")[0]
    )
    assert cells("total", groups[0]) == ["1", "0", "1"]
    assert cells("correct", groups[0]) == ["1", "0", "1"] and cells("format", groups[0]) == ["0.5"] * 3
    assert cells("length", groups[0]) == ["3", "4", "5"] and cells("finish", groups[0]) == ["stop", "stop", "length"]
    assert re.findall(r'class="(pos|neg)">(.*?)<', groups[0].split('"row">advantage')[1].split("</tr>")[0]) == [
        ("pos", "0.577"),
        ("neg", "-1.155"),
        ("pos", "0.577"),
    ]
    assert "&lt;b&gt;answer&lt;/b&gt; 1" in groups[0] and "<b>answer</b>" not in view


def test_held_out_prompts_from_training_evaluations(tmp_path):
    run = write_synthetic_run(tmp_path / "run", steps=20, groups=2, group_size=4, eval_every=10, eval_prompts=40)
    with RolloutStore(run, readonly=True) as store:
        data = eval_prompts(store)
    assert list(data) == ["eval"] and data["eval"]["steps"] == [0, 10, 20] and len(data["eval"]["prompts"]) == 40
    groups = categorize(data["eval"])
    assert sorted(i for ids in groups.values() for i in ids) == list(range(40))  # each prompt in one category
    html = write_report(run).read_text()
    view = html.split('<section id="heldout"')[1].split("</section>")[0]
    for name, ids in groups.items():
        if ids:
            block = view.split(f'data-category="{name}"><h4>{name}: {len(ids)}</h4>')[1].split("</table>")[0]
            assert [int(i) for i in re.findall(r'<td class="p">#(\d+) ', block)] == ids
    first = data["eval"]["prompts"][0]["results"]
    row = view.split('<td class="p">#0 ')[1].split("</tr>")[0]
    assert re.findall(r">(\d+/\d+)<", row) == [f"{c}/{n}" for c, n in (first[0], first[10], first[20])]


def test_a_store_without_per_prompt_results_still_reports(tmp_path):
    run = tmp_path / "run"
    with RolloutStore(run) as store:
        store.write_step(1, [record(0, 0, 1.0, 0.0)], {"reward": 1.0})
        store._conn.execute("DROP TABLE eval_prompts")  # as a store written before the table existed
    html = write_report(run).read_text()
    assert "No per-prompt evaluation results stored" in html


@pytest.mark.slow
def test_a_long_run_gives_a_page_under_10_mb(tmp_path):
    """2,000 steps of 50 rollouts (100,000 stored), 38 metrics a step, an evaluation of 100 prompts every 100."""
    run = write_synthetic_run(tmp_path / "run", steps=2000, groups=5, group_size=10, eval_every=100)
    with RolloutStore(run, readonly=True) as store:
        assert store.query("SELECT count(*) FROM rollouts")[1] == [(100_000,)]
    html = write_report(run)
    size = html.stat().st_size
    assert size < 10_000_000, size
    text = html.read_text()
    data = json.loads(re.search(r'id="grpokit-data">(.*?)</script>', text).group(1))
    assert len(data["Reward"]["reward"]) == 2000  # the JSON keeps every step; the SVG draws a thinned line
    embedded = [int(s) for s in re.findall(r'class="group-step" data-step="(\d+)"', text)]
    assert len(embedded) <= 24 and {1, 1001, 2000} <= set(embedded)  # first, middle, last, and spaced others
    assert all(len(lines) <= MAX_SERIES for lines in data.values())


def test_report_command_embeds_the_steps_asked_for(tmp_path, capsys):
    run = write_synthetic_run(tmp_path / "run", steps=12, groups=2, group_size=3, eval_every=6)
    assert main(["report", str(run), "--steps", "9,3"]) == 0
    html = (run / "report.html").read_text()
    assert re.findall(r'class="group-step" data-step="(\d+)"', html) == ["3", "9"]
    assert re.findall(r"<h3>Step (\d+)</h3>", html) == ["9", "3"]  # best and worst, in the order asked
    with pytest.raises(SystemExit) as exit_:
        main(["report", str(run), "--steps", "3,x"])
    assert exit_.value.code == 2 and "'3,x' is not a list of step numbers" in capsys.readouterr().err


def test_reward_null_fraction_counts_none_apart_from_errors():
    import torch

    from grpokit.rewards.runner import RewardResult

    nan = float("nan")
    # a: None on completion 1 of 3; b: None on completion 0, failed on completion 1 (an error, not a None)
    result = RewardResult(
        names=["a", "b"],
        per_func=torch.tensor([[1.0, nan], [nan, nan], [0.0, 2.0]], dtype=torch.float64),
        combined=torch.tensor([1.0, nan, 2.0], dtype=torch.float64),
        errors=[None, "b: ValueError: x", None],
        error_counts={"a": 0, "b": 1},
    )
    metrics = result.metrics()
    assert metrics["rewards/a/null_fraction"] == pytest.approx(1 / 3)
    assert metrics["rewards/b/null_fraction"] == pytest.approx(1 / 3) and metrics["rewards/b/errors"] == 1.0
    panel = curves([{"step": 1, **metrics}])
    assert set(panel["Reward null fraction"]) == {"rewards/a/null_fraction", "rewards/b/null_fraction"}


def test_groups_view_stops_at_its_budget_keeping_first_last_middle(tmp_path):
    from grpokit.store.groups import _step_html, groups_html

    run = write_synthetic_run(tmp_path / "run", steps=9, groups=2, group_size=3, eval_every=9)
    with RolloutStore(run, readonly=True) as store:
        whole = groups_html(store, list(range(1, 10)))
        ends = len(_step_html(store, 1)) + len(_step_html(store, 9))
        cut = groups_html(store, list(range(1, 10)), budget=ends)
    assert re.findall(r'class="group-step" data-step="(\d+)"', whole) == [str(s) for s in range(1, 10)]
    # the first and the last step's blocks fill the budget: the middle and the rest are named, not embedded
    assert re.findall(r'class="group-step" data-step="(\d+)"', cut) == ["1", "9"]
    assert "Left out to keep the page small: steps 2, 3, 4, 5, 6, 7, 8." in cut
