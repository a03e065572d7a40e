"""A run folder someone sends you: a real tiny run whose rollouts.sqlite was edited (its tables rebuilt without
STRICT, as a store written before STRICT tables could be, then an HTML tag and text written where numbers and JSON
belong). `grpokit report` and `grpokit compare` through the CLI exit 0 without a traceback, name the edited
columns in one line each, and the tag appears nowhere in the pages (docs/security.md)."""

from __future__ import annotations

import shutil
import sqlite3
import subprocess
import sys

import pytest
from shared_helpers import TARGET_REWARD, tiny_args, word_prompts

from grpokit import GRPOTrainer

pytestmark = pytest.mark.usefixtures("one_thread")

TAG = "<img src=x onerror=alert(1)>"


@pytest.fixture(scope="module")
def trained(tmp_path_factory, tiny_model_dir):
    """A 2-step run of the tiny model with an evaluation at step 2 (per-prompt results: the Held-out view)."""
    prompts = word_prompts(12)
    out = tmp_path_factory.mktemp("tampered") / "run"
    args = tiny_args(out, eval_steps=2, num_generations_eval=2, pass_at_k=[1])
    GRPOTrainer(str(tiny_model_dir), TARGET_REWARD, args=args, train_dataset=prompts, eval_dataset=prompts[:4]).train()
    return out


def unstrict(db) -> None:
    """Rebuild every table without STRICT (the schema text edited in place, as anyone holding the file can)."""
    with sqlite3.connect(db) as conn:
        conn.execute("PRAGMA writable_schema = ON")
        conn.execute("UPDATE sqlite_master SET sql = replace(sql, ') STRICT', ')') WHERE type = 'table'")
    conn.close()


def tamper(run) -> None:
    db = run / "rollouts.sqlite"
    conn = sqlite3.connect(db)
    with pytest.raises(sqlite3.IntegrityError, match="cannot store TEXT value in INTEGER column"):
        conn.execute("UPDATE rollouts SET completion_tokens = ?", (TAG,))  # a new store is STRICT: refused
    conn.close()
    unstrict(db)
    with sqlite3.connect(db) as conn:
        conn.execute(
            "UPDATE rollouts SET completion_tokens = ?1, prompt_tokens = ?1, reward = ?1, advantage = 'high', "
            "policy_version = ?1, finish_reason = ?1, completion = ?1, "
            "rewards = json_object('target_fraction', ?1), extra = ?1, conversation = '{\"turns\": 3}'",
            (TAG,),
        )
        conn.execute("UPDATE rollouts SET prompt_index = ?1 WHERE id = (SELECT min(id) FROM rollouts)", (TAG,))
        conn.execute("UPDATE step_metrics SET value = ?1 WHERE name IN ('reward', 'loss')", (TAG,))
        conn.execute("UPDATE evals SET value = ?1", (TAG,))
        conn.execute("UPDATE eval_prompts SET correct = ?1, prompt = ?1 WHERE prompt_index = 0", (TAG,))
        conn.execute("UPDATE eval_prompts SET samples = 'many' WHERE prompt_index = 1")
        conn.execute("UPDATE steps SET written_at = ?1 WHERE step = 2", (TAG,))
        conn.execute("UPDATE meta SET value = ?1 WHERE key = 'run_id'", (TAG,))
    conn.close()


def cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "grpokit.cli", *map(str, args)], capture_output=True, text=True, timeout=300
    )


def test_report_and_compare_of_a_tampered_store(trained, tmp_path):
    run, other = tmp_path / "run", tmp_path / "other"
    shutil.copytree(trained, run)
    shutil.copytree(trained, other)
    (run / "report.html").unlink()
    tamper(run)

    report = cli("report", run)
    assert report.returncode == 0 and "Traceback" not in report.stderr, report.stderr[-3000:]
    page = (run / "report.html").read_text()
    assert TAG not in page and "<img" not in page
    assert "&lt;img src=x onerror=alert(1)&gt;" in page  # shown, escaped (the completion's text, the run id)
    for column in ("rollouts.completion_tokens", "rollouts.reward", "rollouts.prompt_index", "evals.value"):
        assert f'<p class="error">{column}: ' in page  # one line naming the table and column
    assert 'data-step="1"' in page and 'data-step="2"' in page  # the steps' groups are still drawn

    compare = cli("compare", run, other, "-o", tmp_path / "compare.html")
    assert compare.returncode == 0 and "Traceback" not in compare.stderr, compare.stderr[-3000:]
    assert "run: rollouts.completion_tokens: " in compare.stdout
    both = (tmp_path / "compare.html").read_text()
    assert TAG not in both and "<img" not in both

    inspect = cli("inspect", run, "--step", "1")
    assert inspect.returncode == 0 and "Traceback" not in inspect.stderr, inspect.stderr[-3000:]
