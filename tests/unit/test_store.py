"""RolloutStore: writing, refusing duplicates, rolling back, reading, read-only queries."""

import dataclasses
import math
import sqlite3
from types import SimpleNamespace

import pytest

from grpokit.store import DuplicateStepError, QueryError, RolloutRecord, RolloutStore, StoreError


def rollout(prompt_index=0, completion_index=0, reward=1.0, error=None, **overrides):
    """A rollout record as the trainer passes it to write_step."""
    row = dict(
        prompt_index=prompt_index,
        completion_index=completion_index,
        prompt=f"prompt {prompt_index}",
        completion=f"completion {completion_index}",
        prompt_tokens=3,
        completion_tokens=5,
        finish_reason="stop",
        rewards={"accuracy": reward, "format": 0.5},
        reward=reward,
        advantage=0.25,
        policy_version=0,
        error=error,
    )
    row.update(overrides)
    return RolloutRecord(**row)


@pytest.fixture
def store(tmp_path):
    with RolloutStore(tmp_path / "run") as s:
        yield s


def test_write_step_round_trips_every_field(store, tmp_path):
    written = rollout(
        1,
        2,
        reward=0.75,
        error="ValueError: bad",
        finish_reason="length",
        prompt_tokens=7,
        completion_tokens=11,
        policy_version=4,
        advantage=-1.5,
        prompt="p <x>",
        completion="c 'quoted' \"x\" ünïcode",
        extra={"judge": "fine", "score": [1, 2]},
    )
    store.write_step(3, [written], {"kl": 0.125})
    [read] = store.rollouts()
    skipped = ("per_token", "teacher_logprobs", "teacher_tokens_key", "image_sources")  # their own readers, files
    fields = {k: v for k, v in dataclasses.asdict(written).items() if k not in skipped}
    assert read == {**fields, "run_id": "run", "step": 3}
    assert store.path == tmp_path / "run" / "rollouts.sqlite"
    store.write_step(4, [rollout()], {})  # extra is optional and reads as None
    assert store.rollouts(step=4)[0]["extra"] is None


def test_a_store_without_the_extra_column_gets_it_when_opened_for_writing(tmp_path):
    with RolloutStore(tmp_path / "run") as s:
        s.write_step(1, [rollout()], {})
    conn = sqlite3.connect(tmp_path / "run" / "rollouts.sqlite")
    conn.execute("ALTER TABLE rollouts DROP COLUMN extra")  # as a store written before log_extra
    conn.commit()
    conn.close()
    with RolloutStore(tmp_path / "run", readonly=True) as s:
        assert s.rollouts()[0]["extra"] is None
    with RolloutStore(tmp_path / "run") as s:
        s.write_step(2, [rollout(extra={"why": "x"})], {})
        assert [r["extra"] for r in s.rollouts()] == [None, {"why": "x"}]


def test_path_may_be_the_sqlite_file(tmp_path):
    with RolloutStore(tmp_path / "elsewhere.sqlite", run_id="r7") as s:
        s.write_step(1, [rollout()], {})
        assert s.run_id == "r7"
    assert (tmp_path / "elsewhere.sqlite").is_file()


def test_empty_store(store):
    assert store.last_step() == 0
    assert store.steps() == []
    assert store.metrics() == []
    assert store.evals() == []
    assert store.rollouts() == []
    assert store.summary() == []


def test_steps_last_step_and_metrics(store):
    store.write_step(1, [rollout()], {"kl": 0.5, "entropy": 2.0})
    store.write_step(2, [rollout()], {})  # a step without metrics is still a step
    store.write_step(5, [], {"kl": float("nan")})  # NaN is stored as null and read as NaN
    assert store.steps() == [1, 2, 5]
    assert store.last_step() == 5
    metrics = store.metrics()
    assert metrics[:2] == [{"step": 1, "entropy": 2.0, "kl": 0.5}, {"step": 2}]
    assert metrics[2]["step"] == 5 and math.isnan(metrics[2]["kl"])


def test_summary_per_step(store):
    # step 1: rewards 1, 0, 0.5 and one without reward (None), lengths 10, 20, 30, 40, one error
    # -> n 4, mean reward (1 + 0 + 0.5) / 3 = 0.5, mean length 100 / 4 = 25, errors 1.
    rows = [
        rollout(0, i, reward=r, completion_tokens=n, error=e)
        for i, (r, n, e) in enumerate([(1.0, 10, None), (0.0, 20, None), (0.5, 30, None), (None, 40, "boom")])
    ]
    store.write_step(1, rows, {})
    store.write_step(2, [], {})
    assert store.summary() == [
        {"step": 1, "n": 4, "mean_reward": 0.5, "mean_length": 25.0, "errors": 1},
        {"step": 2, "n": 0, "mean_reward": None, "mean_length": None, "errors": 0},
    ]


def test_duplicate_step_is_refused_and_leaves_the_first_write(store):
    store.write_step(1, [rollout(reward=1.0)], {"kl": 0.1})
    with pytest.raises(DuplicateStepError, match="step 1 is already"):
        store.write_step(1, [rollout(reward=0.0), rollout(0, 1)], {"kl": 0.9})
    assert [r["reward"] for r in store.rollouts()] == [1.0]
    assert store.metrics() == [{"step": 1, "kl": 0.1}]


def test_duplicate_completion_in_a_step_writes_nothing(store):
    with pytest.raises(StoreError, match="prompt_index and completion_index"):
        store.write_step(1, [rollout(0, 0), rollout(0, 0)], {"kl": 0.1})
    assert store.steps() == [] and store.rollouts() == [] and store.metrics() == []
    store.write_step(1, [rollout(0, 0)], {})  # the failed write left no step marker behind
    assert store.steps() == [1]


def test_a_rollout_that_is_not_a_record_is_refused(store):
    bad = dataclasses.asdict(rollout())
    with pytest.raises(StoreError, match="rollout 1 of step 4 is a dict, not a RolloutRecord"):
        store.write_step(4, [rollout(), bad], {})
    assert store.steps() == []


def test_non_finite_rewards_are_stored_as_null(store):
    store.write_step(
        1, [rollout(rewards={"a": float("inf"), "b": None, "c": 2}, reward=float("nan"), advantage=float("-inf"))], {}
    )
    [read] = store.rollouts()
    assert read["rewards"] == {"a": None, "b": None, "c": 2.0}
    assert read["reward"] is None and read["advantage"] is None


def test_write_eval_and_evals(store):
    store.write_eval(10, "gsm8k", {"pass@1": 0.25, "pass@8": 0.5})
    store.write_eval(10, "math", {"pass@1": 0.125})
    store.write_eval(20, "gsm8k", {"pass@1": 0.375})
    assert store.evals() == [
        {"step": 10, "dataset": "gsm8k", "pass@1": 0.25, "pass@8": 0.5},
        {"step": 10, "dataset": "math", "pass@1": 0.125},
        {"step": 20, "dataset": "gsm8k", "pass@1": 0.375},
    ]
    with pytest.raises(DuplicateStepError, match="'gsm8k' at step 10"):
        store.write_eval(10, "gsm8k", {"pass@1": 0.9})
    assert store.evals()[0]["pass@1"] == 0.25


def test_rollback_after_deletes_later_steps_everywhere(store):
    for step in range(1, 5):
        store.write_step(step, [rollout(0, 0), rollout(0, 1)], {"kl": step / 10})
        store.write_eval(step, "d", {"pass@1": step / 4})
    store.rollback_after(2)
    assert store.steps() == [1, 2]
    assert store.last_step() == 2
    assert sorted({r["step"] for r in store.rollouts()}) == [1, 2]
    assert len(store.rollouts()) == 4
    assert [m["step"] for m in store.metrics()] == [1, 2]
    assert [e["step"] for e in store.evals()] == [1, 2]
    # The resumed run rewrites step 3 exactly once.
    store.write_step(3, [rollout(0, 0, reward=0.0)], {"kl": 0.7})
    assert [r["reward"] for r in store.rollouts(step=3)] == [0.0]
    assert store.metrics()[-1] == {"step": 3, "kl": 0.7}


def test_rollouts_filters_order_and_limit(store):
    store.write_step(
        1,
        [
            rollout(0, 0, reward=0.5),
            rollout(0, 1, reward=None, error="boom"),
            rollout(1, 0, reward=2.0),
            rollout(1, 1, reward=-1.0),
        ],
        {},
    )
    store.write_step(2, [rollout(0, 0, reward=3.0), rollout(1, 0, reward=1.0, error="x")], {})

    def keys(rows):
        return [(r["step"], r["prompt_index"], r["completion_index"]) for r in rows]

    assert keys(store.rollouts()) == [(1, 0, 0), (1, 0, 1), (1, 1, 0), (1, 1, 1), (2, 0, 0), (2, 1, 0)]
    assert keys(store.rollouts(step=2)) == [(2, 0, 0), (2, 1, 0)]
    assert keys(store.rollouts(prompt_index=1)) == [(1, 1, 0), (1, 1, 1), (2, 1, 0)]
    assert keys(store.rollouts(errors_only=True)) == [(1, 0, 1), (2, 1, 0)]
    # Rewards 0.5, None, 2, -1, 3, 1: descending 3, 2, 1, 0.5, -1, then the missing one last.
    assert [r["reward"] for r in store.rollouts(order_by_reward="desc")] == [3.0, 2.0, 1.0, 0.5, -1.0, None]
    assert [r["reward"] for r in store.rollouts(order_by_reward="asc", limit=2)] == [-1.0, 0.5]
    assert [r["reward"] for r in store.rollouts(step=1, order_by_reward="asc")] == [-1.0, 0.5, 2.0, None]
    assert keys(store.rollouts(step=1, prompt_index=0, errors_only=True)) == [(1, 0, 1)]
    with pytest.raises(ValueError, match="order_by_reward"):
        store.rollouts(order_by_reward="best")


def test_query_reads_tables_and_views(store):
    store.write_step(1, [rollout(0, 0, reward=1.0), rollout(0, 1, reward=0.0)], {"kl": 0.5})
    columns, rows = store.query("SELECT name, avg(value) FROM reward_values GROUP BY name")
    # accuracy: (1 + 0) / 2 = 0.5; format: 0.5 in both rows.
    assert columns == ["name", "avg(value)"]
    assert rows == [("accuracy", 0.5), ("format", 0.5)]
    columns, rows = store.query(
        "-- reward by function\n/* json */ WITH x AS (SELECT json_extract(rewards, '$.accuracy')"
        " AS a FROM rollouts) SELECT sum(a) AS total FROM x;"
    )
    assert (columns, rows) == (["total"], [(1.0,)])


@pytest.mark.parametrize(
    "sql",
    [
        "INSERT INTO steps (step, written_at) VALUES (9, 0)",
        "DELETE FROM rollouts",
        "UPDATE rollouts SET reward = 0",
        "DROP TABLE rollouts",
        "PRAGMA journal_mode=DELETE",
        "ATTACH DATABASE ':memory:' AS x",
        "WITH doomed AS (SELECT 1) DELETE FROM rollouts",
        "SELECT 1; DELETE FROM rollouts",
        "SELECT 1; SELECT 2",
        "   ",
    ],
)
def test_query_rejects_anything_but_one_select(store, sql):
    store.write_step(1, [rollout()], {})
    with pytest.raises(QueryError):
        store.query(sql)
    assert store.steps() == [1] and len(store.rollouts()) == 1


def test_query_reports_bad_sql(store):
    with pytest.raises(QueryError, match="no such table: nope"):
        store.query("SELECT * FROM nope")


def test_readonly_store(tmp_path):
    with pytest.raises(StoreError, match="no rollout store"):
        RolloutStore(tmp_path / "missing", readonly=True)
    with RolloutStore(tmp_path / "run", run_id="abc") as writer:
        writer.write_step(1, [rollout()], {"kl": 0.5})
    with RolloutStore(tmp_path / "run", readonly=True) as reader:
        assert reader.run_id == "abc"
        assert reader.metrics() == [{"step": 1, "kl": 0.5}]
        with pytest.raises(StoreError, match="read-only"):
            reader.write_step(2, [rollout()], {})
        with pytest.raises(StoreError, match="read-only"):
            reader.rollback_after(0)
        assert reader.steps() == [1]


def test_reader_sees_the_writers_commits(tmp_path):
    with RolloutStore(tmp_path / "run") as writer:
        writer.write_step(1, [rollout()], {})
        with RolloutStore(tmp_path / "run", readonly=True) as reader:
            assert reader.steps() == [1]
            writer.write_step(2, [rollout()], {})
            assert reader.steps() == [1, 2]
            assert reader.query("SELECT count(*) FROM rollouts")[1] == [(2,)]


def test_reopening_keeps_rows_and_run_id(tmp_path):
    with RolloutStore(tmp_path / "run", run_id="first") as s:
        s.write_step(1, [rollout()], {})
    with RolloutStore(tmp_path / "run") as s:
        assert s.run_id == "first"
        s.write_step(2, [rollout()], {})
    with RolloutStore(tmp_path / "run", run_id="second") as s:
        s.write_step(3, [rollout()], {})
        assert [r["run_id"] for r in s.rollouts()] == ["first", "first", "second"]


def test_not_a_store(tmp_path):
    junk = tmp_path / "junk.sqlite"
    junk.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(StoreError, match="not a grpokit rollout store"):
        RolloutStore(junk)
    with pytest.raises(StoreError, match="not a grpokit rollout store"):
        RolloutStore(junk, readonly=True)


def test_other_schema_version_is_refused(tmp_path):
    RolloutStore(tmp_path / "run").close()
    with sqlite3.connect(tmp_path / "run" / "rollouts.sqlite") as conn:
        conn.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    with pytest.raises(StoreError, match="schema version 99"):
        RolloutStore(tmp_path / "run", readonly=True)


def test_close_is_idempotent_and_final(tmp_path):
    s = RolloutStore(tmp_path / "run")
    s.query("SELECT 1")  # opens the query connection too
    s.close()
    s.close()
    with pytest.raises(sqlite3.ProgrammingError):
        s.steps()


def test_rollout_records_of_a_step():
    # two prompts (indices 7 and 3) x G = 2; the second function gave None (NaN) on completion 1 and
    # no function applied to completion 3 (combined NaN): both are None in the records
    import torch

    from grpokit.rewards.runner import RewardResult
    from grpokit.store import rollout_records

    nan = float("nan")
    rollouts = SimpleNamespace(
        num_generations=2,
        completion_lengths=torch.tensor([3, 1, 2, 4]),
        finish_reasons=["stop", "stop", "length", "stop"],
        policy_version=5,
        conversations=None,  # single-turn rollouts
    )
    reward = RewardResult(
        names=["a", "b"],
        per_func=torch.tensor([[1.0, 0.5], [0.0, nan], [2.0, 0.0], [nan, nan]], dtype=torch.float64),
        combined=torch.tensor([1.5, 0.0, 2.0, nan], dtype=torch.float64),
        errors=[None, None, None, "a: boom"],
        error_counts={"a": 1, "b": 0},
        extra={"why": ["x", None, "z", None]},
    )
    source = SimpleNamespace(texts={7: "seven", 3: "three"}, ids={7: [1, 2], 3: [4, 5, 6]})
    records = rollout_records([7, 3], rollouts, ["c0", "c1", "c2", "c3"], reward, [0.5, -0.5, 1.0, 0.0], source)
    assert [(r.prompt_index, r.completion_index, r.prompt, r.prompt_tokens) for r in records] == [
        (7, 0, "seven", 2),
        (7, 1, "seven", 2),
        (3, 0, "three", 3),
        (3, 1, "three", 3),
    ]
    assert records[1] == RolloutRecord(
        7, 1, "seven", "c1", 2, 1, "stop", {"a": 0.0, "b": None}, 0.0, -0.5, 5, None, {"why": None}
    )
    assert records[3].rewards == {"a": None, "b": None} and records[3].reward is None
    assert records[3].error == "a: boom" and records[2].finish_reason == "length"
