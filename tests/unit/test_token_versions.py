"""Each token's policy version: the store's runs (hand-worked), the partial rollout's assembly from its pieces, and
the store's column (round trip, a store written before it, its digest)."""

import sqlite3

import pytest
import torch

from grpokit.rollout.vllm.partial import _Piece, pieces_to_rollouts, sample_requests
from grpokit.store import RolloutRecord, RolloutStore
from grpokit.store.integrity import step_digest
from grpokit.store.record import completion_runs
from grpokit.store.versions import expand_runs, version_runs


def test_version_runs_by_hand():
    # tokens 0-4 by version 3, 5-7 by version 4: two runs, each [first token, version]
    assert version_runs([3, 3, 3, 3, 3, 4, 4, 4], policy_version=3) == [[0, 3], [5, 4]]
    # all by the rollout's policy_version: nothing to store (NULL)
    assert version_runs([3, 3, 3], policy_version=3) is None
    assert version_runs([], policy_version=3) is None
    # all by another version than policy_version: one run, kept
    assert version_runs([4, 4], policy_version=3) == [[0, 4]]
    # a version that comes back (v1, v2, v1): three runs
    assert version_runs([1, 2, 2, 1], policy_version=1) == [[0, 1], [1, 2], [3, 1]]


def test_expand_runs_by_hand():
    assert expand_runs([[0, 3], [5, 4]], 8, policy_version=3) == [3, 3, 3, 3, 3, 4, 4, 4]
    assert expand_runs("[[0, 3], [5, 4]]", 6, policy_version=3) == [3, 3, 3, 3, 3, 4]  # the stored JSON text
    assert expand_runs(None, 3, policy_version=7) == [7, 7, 7]  # NULL: all by policy_version
    for versions in ([1, 2, 2, 1], [5], [0, 0, 1, 1, 1]):
        assert expand_runs(version_runs(versions, 0), len(versions), 0) == versions


@pytest.mark.parametrize("runs", [[[1, 3]], [[0, 3], [0, 4]], [[0, 3], [9, 4]]])
def test_expand_runs_refuses_runs_that_do_not_cover_the_completion(runs):
    with pytest.raises(ValueError, match="do not cover a completion of 8 tokens from token 0"):
        expand_runs(runs, 8, policy_version=3)


def test_sample_requests_give_sample_i_of_a_group_seed_plus_i():
    assert sample_requests([[5], [6, 7]], [10, 20], 2, greedy=False) == [
        ([5], 10),
        ([5], 11),
        ([6, 7], 20),
        ([6, 7], 21),
    ]
    assert sample_requests([[5]], [10], 3, greedy=True) == [([5], 10)] * 3


def test_pieces_to_rollouts_keep_each_tokens_log_prob_and_version():
    # sample 0: 3 tokens, the first two by version 2, the third by version 3 (after the update); sample 1: 1 token
    pieces = [
        _Piece([4, 5, 6], [-0.5, -1.0, -0.25], [2, 2, 3], "length"),
        _Piece([9], [-2.0], [2], "stop"),
    ]
    r = pieces_to_rollouts([[1, 2]], pieces, 2, pad_token_id=0, first_version=2)
    assert r.completion_ids.tolist() == [[4, 5, 6], [9, 0, 0]]
    assert r.completion_mask.tolist() == [[1, 1, 1], [1, 0, 0]]
    assert r.logprobs.tolist() == [[-0.5, -1.0, -0.25], [-2.0, 0.0, 0.0]]  # each the sampling policy's
    assert r.token_versions.tolist() == [[2, 2, 3], [2, 0, 0]] and r.policy_version == 2
    assert completion_runs(r, 0) == [[0, 2], [2, 3]] and completion_runs(r, 1) is None
    same = pieces_to_rollouts([[1, 2]], [_Piece([4], [-0.5], [2], "stop")] * 2, 2, 0, first_version=2)
    assert same.token_versions is None  # no update reached it: as any engine's rollouts


def test_pieces_to_rollouts_refuse_an_unfinished_sample():
    with pytest.raises(RuntimeError, match="reason 'abort'"):
        pieces_to_rollouts([[1]], [_Piece([4], [-0.5], [0], "abort")], 1, 0, 0)


def record(runs=None, **fields):
    values = dict(
        prompt_index=0,
        completion_index=0,
        prompt="p",
        completion="c",
        prompt_tokens=1,
        completion_tokens=8,
        finish_reason="length",
        rewards={"a": 1.0},
        reward=1.0,
        advantage=0.5,
        policy_version=3,
        token_versions=runs,
    )
    values.update(fields)
    return RolloutRecord(**values)


def test_store_keeps_the_runs_and_reads_a_store_written_before_the_column(tmp_path):
    with RolloutStore(tmp_path / "run") as s:
        s.write_step(1, [record([[0, 3], [5, 4]]), record(completion_index=1)], {})
        read = s.rollouts()
        assert [r["token_versions"] for r in read] == [[[0, 3], [5, 4]], None]
        assert expand_runs(read[0]["token_versions"], 8, read[0]["policy_version"]) == [3] * 5 + [4] * 3
        _, rows = s.query("SELECT count(*) FROM rollouts WHERE token_versions IS NOT NULL")
        assert rows == [(1,)]
    old = tmp_path / "old"
    with RolloutStore(old) as s:
        s.write_step(1, [record()], {"kl": 0.5})
        with_column = step_digest(s._conn, 1)
    conn = sqlite3.connect(old / "rollouts.sqlite")
    conn.execute("ALTER TABLE rollouts DROP COLUMN token_versions")  # as a store written before the column
    conn.commit()
    assert step_digest(conn, 1) == with_column  # NULL digests as no column: a checkpoint's chain still holds
    conn.close()
    with RolloutStore(old, readonly=True) as s:
        assert s.rollouts()[0]["token_versions"] is None
    with RolloutStore(old) as s:  # opened for writing: the column is added, the old rows stay NULL
        s.write_step(2, [record([[0, 3], [1, 4]])], {})
        assert [r["token_versions"] for r in s.rollouts()] == [None, [[0, 3], [1, 4]]]
        assert step_digest(s._conn, 1) == with_column


def test_rollout_records_carry_the_runs():
    from types import SimpleNamespace

    from grpokit.rewards.runner import RewardResult
    from grpokit.store import rollout_records

    pieces = [_Piece([4, 5], [-0.5, -1.0], [0, 1], "length"), _Piece([6, 7], [-0.5, -1.0], [0, 0], "length")]
    rollouts = pieces_to_rollouts([[1]], pieces, 2, 0, first_version=0)
    reward = RewardResult(
        names=["a"],
        per_func=torch.tensor([[1.0], [0.0]], dtype=torch.float64),
        combined=torch.tensor([1.0, 0.0], dtype=torch.float64),
        errors=[None, None],
        error_counts={"a": 0},
        extra={},
    )
    source = SimpleNamespace(texts={0: "p"}, ids={0: [1]})
    records = rollout_records([0], rollouts, ["x", "y"], reward, [0.5, -0.5], source)
    assert [r.token_versions for r in records] == [[[0, 0], [1, 1]], None]
