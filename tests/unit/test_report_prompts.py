"""The report's Prompts view (store/prompts_view.py): the replayed history against the store's own prompt_history
table, the rows' order and retired marks worked by hand, the bounded rows and columns of a long run, and a store
edited by hand."""

from __future__ import annotations

import re
import sqlite3
import sys
from pathlib import Path

import yaml

from grpokit.store import RolloutStore, write_report
from grpokit.store.prompts_view import (
    MAX_COLUMNS,
    MAX_ROWS,
    column_runs,
    history_settings,
    ordered,
    replay,
    run_settings,
    spaced,
)
from grpokit.store.report import report_page
from grpokit.store.sql_schema import schema_sql

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
from synthetic_run import write_prompt_run, write_synthetic_run

TAG = "<img src=x onerror=alert(1)>"


def section(html: str) -> str:
    return re.search(r'<section id="prompts" class="view">.*?</section>', html, re.DOTALL).group(0)


def test_replay_worked_by_hand_and_equal_to_the_stored_table(tmp_path):
    run = write_prompt_run(tmp_path / "run")
    with RolloutStore(run, readonly=True) as store:
        assert history_settings(store) == (4, 1.0)
        assert run_settings(run) == (0.75, 2)
        tracks = replay(store, 4, 1.0, 0.75)
        table = {row["prompt_index"]: row for row in store.prompt_history()}
    # window 4, learned at pass rate >= 0.75:
    # p0: s1 [1,0] 0.5; s2 [1,0,1,1] 0.75: learned at 2; s3 [1,1,1,1] 1.0; solved at s2, s3: streak 2 (retired at 2)
    # p1: s1 [0,0] 0; s3 [0,0,1,0] 0.25; s4 [1,0,1,1] 0.75: learned at 4; streak 1 (s4)
    # p2: s2 [1,1] 1.0: learned at 2; s3 [1,1,0,1] 0.75; s4 [0,1,1,1] 0.75; streak 1 (s3 failed one)
    # p3: s1 [0,0], s4 [0,0,0,0] 0: never; p4: s4 [1,0] 0.5: never
    expected = {0: (2, 1.0, 2), 1: (4, 0.75, 1), 2: (2, 0.75, 1), 3: (None, 0.0, 0), 4: (None, 0.5, 0)}
    assert {i: (t.learned, t.pass_rate, t.streak) for i, t in tracks.items()} == expected
    assert {i: (t.visits, t.samples) for i, t in tracks.items()} == {
        0: (3, 6),
        1: (3, 6),
        2: (3, 6),
        3: (2, 4),
        4: (1, 2),
    }
    assert tracks[0].per_step == {1: (1, 2), 2: (2, 2), 3: (2, 2)}
    # the same rule as the table the curriculum reads
    for i, t in tracks.items():
        row = table[i]
        assert (row["pass_rate"], row["solved_streak"], row["samples"], row["steps_sampled"]) == (
            t.pass_rate, t.streak, t.samples, t.visits,
        )  # fmt: skip
    # learned at 2 (p0 recent 1.0 before p2's 0.75), then at 4, then never learned by pass rate (0.5, then 0)
    assert ordered(tracks) == [0, 2, 1, 4, 3]


def test_the_view_shows_rows_cells_and_the_retired_prompt(tmp_path):
    run = write_prompt_run(tmp_path / "run")
    view = section(report_page(run))
    assert "5 prompts sampled, 3 learned" in view and "1 retired" in view
    rows = re.findall(r'<tr data-prompt="(\d+)"( class="retired")?>(.*?)</tr>', view)
    assert [(i, bool(r)) for i, r, _ in rows] == [("0", True), ("2", False), ("1", False), ("4", False), ("3", False)]
    first = rows[0][2]
    # learned at, visits, samples, recent pass rate; then one cell per step: 1/2 (shade 2 of 4), 2/2, 2/2, none
    assert re.findall(r"<td>([^<]*)</td>", first)[:4] == ["2", "3", "6", "1.00"]
    assert re.findall(r'<td class="h(\d)" title="step (\d): (\d/\d) passed"></td>', first) == [
        ("2", "1", "1/2"), ("4", "2", "2/2"), ("4", "3", "2/2"),
    ]  # fmt: skip
    assert first.endswith("<td></td>")  # not sampled at step 4
    assert re.findall(r'<th title="step (\d)">', view) == ["1", "2", "3", "4"]


def test_without_retire_after_nothing_is_retired(tmp_path):
    run = write_prompt_run(tmp_path / "run")
    (run / "config.yaml").write_text(yaml.safe_dump({"data": {"retire_after": "often", "pool_easy_above": 7}}))
    assert run_settings(run) == (0.8, None)  # neither is a valid value: the defaults
    view = section(report_page(run))
    assert "none retired (the run does not set data.retire_after)" in view and 'class="retired"' not in view
    assert "2 learned" in view  # at 0.8: p2 (step 2: 1.0) and p0 (step 3: 1.0); p1 stops at 0.75
    (run / "config.yaml").write_text(":: not yaml [")
    assert run_settings(run) == (0.8, None)


def test_runs_of_columns_and_spaced_rows():
    # 10 steps in 4 columns: lengths 2, 3, 2, 3 (i * 10 // 4 = 0, 2, 5, 7, 10)
    assert column_runs(list(range(1, 11)), 4) == [[1, 2], [3, 4, 5], [6, 7], [8, 9, 10]]
    assert column_runs([5, 9], 4) == [[5], [9]]
    # 10 items, 4 kept: round(i * 9 / 3) = 0, 3, 6, 9
    assert spaced(list(range(10)), 4) == [0, 3, 6, 9] and spaced([1, 2], 4) == [1, 2]


def test_a_long_run_keeps_the_view_bounded(tmp_path):
    run = write_synthetic_run(tmp_path / "run", steps=100, groups=5, group_size=4, eval_every=100)
    view = section(write_report(run).read_text())
    with RolloutStore(run, readonly=True) as store:
        n = store.query("SELECT count(DISTINCT prompt_index) FROM rollouts")[1][0][0]
        tracks = replay(store, *history_settings(store), 0.8)
    assert n == 500 and len(tracks) == 500
    rows = re.findall(r'<tr data-prompt="(\d+)"', view)
    order = [str(i) for i in ordered(tracks)]
    assert len(rows) == MAX_ROWS and rows[0] == order[0] and rows[-1] == order[-1]
    assert f"{MAX_ROWS} of 500 shown" in view and f"100 steps in {MAX_COLUMNS} runs" in view
    heads = re.findall(r'<th title="([^"]*)">', view)
    # 100 steps in 60 runs, run i from step i * 100 // 60 + 1: [1], [2, 3], [4, 5], [6], ...; 40 of 2 steps, 20 of 1
    assert len(heads) == MAX_COLUMNS and heads[:4] == ["step 1", "steps 2-3", "steps 4-5", "step 6"]
    assert sum(h.startswith("steps") for h in heads) == 40
    assert len(view) < 1_000_000


def test_a_store_edited_by_hand_still_renders_escaped(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    with sqlite3.connect(run / "rollouts.sqlite") as db:  # as a grpokit before STRICT tables created it
        db.executescript(schema_sql((3, 36, 0)))
        db.executemany("INSERT INTO meta VALUES (?, ?)", [("schema_version", "1"), ("run_id", "old")])
    db.close()
    write_prompt_run(run, prompts={0: TAG})
    db = sqlite3.connect(run / "rollouts.sqlite")
    with db:
        db.execute("UPDATE rollouts SET reward = 'high' WHERE step = 2 AND prompt_index = 2 AND completion_index = 0")
        db.execute("UPDATE rollouts SET step = 'one' WHERE step = 4 AND prompt_index = 4")
        db.execute("UPDATE meta SET value = 'wide' WHERE key = 'prompt_history.window'")
    db.close()
    page = report_page(run)
    view = section(page)
    assert TAG not in page and "#0 <code>&lt;img src=x onerror=alert(1)&gt;</code>" in view
    assert "over the last 16 completions" in view  # the window that is not a number: the default
    assert 'data-prompt="4"' not in view  # its only rows' step is text: left out
    assert re.search(r'<tr data-prompt="2">.*?title="step 2: 1/2 passed"', view)  # 'high' is not a pass
    assert "rollouts.reward: 1 value of the wrong type" in page and "rollouts.step: 2 values" in page
