"""Reports of run folders from others: every value a page shows is escaped whatever its type, JSON in a script
element has no ``<``, ``>`` or ``&``, new stores are STRICT (old ones still read and write), a store's values of the
wrong type are counted per table and column and read as None, and the read-only fallback page is a mkstemp file."""

from __future__ import annotations

import json
import os
import re
import sqlite3
import stat
import tempfile
from pathlib import Path

import pytest
import yaml

from grpokit.commands.report import write_fallback_report
from grpokit.store import RolloutRecord, RolloutStore
from grpokit.store.compare import RunData
from grpokit.store.compare_page import compare_page
from grpokit.store.groups import _group_html
from grpokit.store.heldout import _table
from grpokit.store.html_text import number, script_json
from grpokit.store.report import report_page
from grpokit.store.samples import rollout_html
from grpokit.store.sql_schema import schema_sql
from grpokit.store.summary import _changes_table
from grpokit.store.typed_rows import Problems, clean, wrong_types

TAG = "<img src=x onerror=alert(1)>"


def test_script_json_has_no_markup_characters_and_reads_back():
    value = {"name": "</script><script>alert('&')</script>", "n": [1, 2.5]}
    out = script_json(value)
    assert not set("<>&") & set(out)
    assert json.loads(out) == value


def test_number_formats_numbers_and_escapes_anything_else():
    assert number(0.123456) == "0.1235" and number(None) == "-" and number(3, "+.4g") == "+3"
    assert number(TAG) == "&lt;img src=x onerror=alert(1)&gt;"


def tampered_rollout() -> dict:
    """A rollout as a hand-edited store could give it to a renderer: text in every number's place."""
    return {
        "step": TAG,
        "prompt_index": TAG,
        "completion_index": TAG,
        "prompt": TAG,
        "completion": TAG,
        "prompt_tokens": TAG,
        "completion_tokens": TAG,
        "finish_reason": TAG,
        "rewards": {TAG: TAG},
        "reward": TAG,
        "advantage": TAG,
        "policy_version": TAG,
        "error": TAG,
        "extra": {TAG: TAG},
        "conversation": None,
    }


def test_renderers_escape_values_of_any_type():
    r = tampered_rollout()
    pages = [
        rollout_html(r, "best"),
        _group_html(TAG, [r, dict(r, completion_index=1)]),
        _table("learned", [0], {"prompts": {0: {"prompt": TAG, "results": {TAG: (TAG, 4)}}}}, [TAG]),
        _changes_table([{"name": TAG, "first": TAG, "first_step": TAG, "last": 1.0, "last_step": TAG, "change": 0}]),
    ]
    for html in pages:
        assert "<img" not in html and "&lt;img src=x onerror=alert(1)&gt;" in html


def test_compare_page_escapes_run_values():
    run = RunData(Path(TAG), TAG, config={"model": {TAG: TAG}}, last_step=2)
    other = RunData(Path("b"), "b", config={"model": {TAG: 1}}, last_step=2)
    html = compare_page([run, other], [RunData(Path("c"), "c", problem=TAG)])
    assert "<img" not in html and "&lt;img" in html


def record(i: int, reward: float) -> RolloutRecord:
    return RolloutRecord(i, 0, f"p{i}", f"c{i}", 3, 2, "stop", {"r": reward}, reward, 0.0, 0)


def test_report_page_embeds_json_no_markup_can_end(tmp_path):
    """A metric name and a model name that close the script element: the JSON reads back, the page holds neither."""
    run = tmp_path / "run"
    name = "</script><script>alert(1)</script>"
    (tmp_path / "run").mkdir()
    (run / "config.yaml").write_text(yaml.safe_dump({"model": {"model_name_or_path": f"{TAG}&"}}))
    with RolloutStore(run) as store:
        store.write_step(1, [record(0, 1.0)], {name: 0.5, "reward": 1.0})
        store.write_step(2, [record(0, 0.0)], {name: 0.25, "reward": 0.0})
    page = report_page(run)
    assert name not in page and TAG not in page
    data = json.loads(re.search(r'id="grpokit-data">(.*?)</script>', page).group(1))
    assert any(name in lines for lines in data.values())
    summary = json.loads(re.search(r'id="grpokit-summary">(.*?)</script>', page).group(1))
    assert summary["model"] == f"{TAG}&"


def test_new_stores_are_strict_and_refuse_text_for_numbers(tmp_path):
    with RolloutStore(tmp_path) as store:
        store.write_step(1, [record(0, 1.0)], {"reward": 1.0})
    with sqlite3.connect(tmp_path / "rollouts.sqlite") as conn:
        tables = conn.execute("SELECT name, sql FROM sqlite_master WHERE type = 'table'").fetchall()
        assert tables and all(sql.rstrip().endswith("STRICT") for _, sql in tables), tables
        with pytest.raises(sqlite3.IntegrityError, match="cannot store TEXT value in INTEGER column"):
            conn.execute("UPDATE rollouts SET completion_tokens = 'many'")
    conn.close()


def test_an_old_store_without_strict_tables_still_reads_and_writes(tmp_path):
    path = tmp_path / "rollouts.sqlite"
    with sqlite3.connect(path) as conn:  # as a grpokit before STRICT tables created it
        conn.executescript(schema_sql((3, 36, 0)))
        conn.executemany("INSERT INTO meta VALUES (?, ?)", [("schema_version", "1"), ("run_id", "old")])
    conn.close()
    with RolloutStore(tmp_path) as store:
        store.write_step(1, [record(0, 1.0), record(1, 0.0)], {"reward": 0.5})
    with sqlite3.connect(path) as conn:
        assert "STRICT" not in conn.execute("SELECT sql FROM sqlite_master WHERE name = 'rollouts'").fetchone()[0]
        conn.execute("UPDATE rollouts SET completion_tokens = 'many' WHERE prompt_index = 1")  # allowed here
        conn.execute("UPDATE rollouts SET step = 'one' WHERE prompt_index = 0")
    conn.close()
    with RolloutStore(tmp_path, readonly=True) as store:
        assert store.run_id == "old" and store.metrics() == [{"step": 1, "reward": 0.5}]
        # the row whose step is text cannot be placed: left out; the other reads with None for its length
        assert [(r["prompt_index"], r["completion_tokens"]) for r in store.rollouts()] == [(1, None)]
        lines = store.problems()
    assert lines[0].startswith("rollouts.completion_tokens: 1 value of the wrong type (not INTEGER)")
    assert lines[1].startswith("rollouts.step: 1 value of the wrong type (not INTEGER)")
    assert len(lines) == 2


def test_wrong_types_counts_each_column_and_bad_json(tmp_path):
    path = tmp_path / "rollouts.sqlite"
    with sqlite3.connect(path) as conn:
        conn.executescript(schema_sql((3, 36, 0)))
        row = "INSERT INTO rollouts (run_id, step, prompt_index, completion_index, prompt, completion, prompt_tokens, "
        row += "completion_tokens, finish_reason, rewards, reward, policy_version) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)"
        conn.execute(row, ("r", 1, 0, 0, "p", "c", 3, "x", "stop", "{}", 0.5, 0))
        conn.execute(row, ("r", 1, 0, 1, "p", "c", 3, "y", "stop", "not json", "high", 0))
        conn.execute(row, ("r", 1, 0, 2, "p", "c", 3, 4, "stop", "{}", 2, 0))  # an integer reward is a number
        # 2 lengths of text, 1 rewards not JSON, 1 reward of text
        assert wrong_types(conn, ["rollouts"]) == {
            "rollouts.completion_tokens": 2,
            "rollouts.rewards": 1,
            "rollouts.reward": 1,
        }
    conn.close()


def test_clean_replaces_wrong_values_and_leaves_out_unplaceable_rows():
    found = Problems()
    columns = ("step", "name", "value")
    assert clean("step_metrics", columns, (1, "loss", "high"), found) == (1, "loss", None)
    assert clean("step_metrics", columns, (1, "loss", 2), found) == (1, "loss", 2)  # an integer REAL is fine
    assert clean("step_metrics", columns, ("1", "loss", 0.5), found) is None
    assert found.found == {"step_metrics.value": 1, "step_metrics.step": 1}


def test_the_fallback_report_is_a_new_private_file_nobody_can_plant(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    run = tmp_path / "x"
    run.mkdir()
    target = tmp_path / "elsewhere"
    target.write_text("keep")
    for guess in ("grpokit-report-x.html", "grpokit-report-x-00000000.html"):  # a link where a guess would write
        os.symlink(target, tmp_path / guess)
    first = write_fallback_report(run, "<p>one</p>")
    second = write_fallback_report(run, "<p>two</p>")
    assert first != second and first.parent == tmp_path and first.name.startswith("grpokit-report-x-")
    assert first.read_text() == "<p>one</p>" and second.read_text() == "<p>two</p>"
    assert stat.S_IMODE(first.stat().st_mode) == 0o600 and not first.is_symlink()
    assert target.read_text() == "keep"
