"""Resume replay's keys and choice (grpokit/train/teacher/replay.py, Distiller._teacher_logprobs): stored teacher
log-probs are reused only when every row's teacher and tokens match; otherwise the teacher scores the whole step."""

from __future__ import annotations

import torch

from grpokit.rollout.types import Rollouts
from grpokit.train.teacher.distiller import Distiller
from grpokit.train.teacher.replay import row_keys, tokens_key


class CountingTeacher:
    def __init__(self):
        self.calls = 0

    def logprobs(self, rollouts, pad_token_id):
        self.calls += 1
        return torch.full(rollouts.completion_ids.shape, -9.0) * rollouts.completion_mask


def rollouts() -> Rollouts:
    completions = torch.tensor([[7, 8, 9], [10, 2, 0]])
    mask = torch.tensor([[1.0, 1, 1], [1, 1, 0]])
    return Rollouts([[1, 4]], completions, mask, torch.zeros(2, 3), ["stop"] * 2, 2)


def test_tokens_key_names_the_teacher_and_every_id():
    key = tokens_key("t", [1, 2], [3])
    assert key == tokens_key("t", [1, 2], [3])
    assert key != tokens_key("u", [1, 2], [3])  # another teacher
    assert key != tokens_key("t", [1], [2, 3])  # the prompt/completion boundary counts
    assert key != tokens_key("t", [1, 2], [3, 0])  # a padding id past the completion is not one of its tokens
    # row_keys reads each completion up to its length: row 2 is [10, 2], not [10, 2, 0]
    assert row_keys("t", rollouts()) == [tokens_key("t", [1, 4], [7, 8, 9]), tokens_key("t", [1, 4], [10, 2])]


def test_a_step_whose_rows_are_all_stored_is_replayed_else_scored():
    teacher = CountingTeacher()
    distiller = Distiller(teacher, 1.0, procs=None, pad_token_id=0, name="t")
    keys = row_keys("t", rollouts())
    distiller.replay = {keys[0]: [-1.0, -2.0, -3.0], keys[1]: [-4.0, -5.0]}
    got = distiller._teacher_logprobs(rollouts(), keys)
    assert teacher.calls == 0 and distiller.replayed == 1 and distiller.calls == 0
    assert got.tolist() == [[-1.0, -2.0, -3.0], [-4.0, -5.0, 0.0]]  # 0 past the completion, as the teacher's
    assert distiller.replay == {}  # used once
    distiller.replay = {keys[0]: [-1.0, -2.0, -3.0]}  # row 2 not stored: the teacher scores the step
    got = distiller._teacher_logprobs(rollouts(), keys)
    assert teacher.calls == 1 and distiller.calls == 1
    assert got.tolist() == [[-9.0, -9.0, -9.0], [-9.0, -9.0, 0.0]]


def test_the_store_keeps_the_tokens_key_and_gives_the_steps_after_a_point(tmp_path):
    """teacher_logprobs_by_tokens(after): the stored values of later steps by key; a teacher table written before the
    key column gets it when the store is opened for writing, and its old rows (no key) are never replayed."""
    import sqlite3

    from grpokit.store import RolloutRecord, RolloutStore
    from grpokit.store.teacher_values import encode

    def record(index: int, key: str | None) -> RolloutRecord:
        return RolloutRecord(
            prompt_index=0, completion_index=index, prompt="p", completion="c", prompt_tokens=1, completion_tokens=2,
            finish_reason="stop", rewards={"r": 1.0}, reward=1.0, advantage=0.0, policy_version=0,
            teacher_logprobs=encode([-0.5, -1.5]), teacher_tokens_key=key,
        )  # fmt: skip

    path = tmp_path / "run" / "rollouts.sqlite"
    with RolloutStore(path, run_id="run") as store:
        store.write_step(1, [record(0, "a")], {})
        store.write_step(2, [record(0, "b"), record(1, None)], {})
        assert store.teacher_logprobs_by_tokens(0) == {"a": [-0.5, -1.5], "b": [-0.5, -1.5]}
        assert store.teacher_logprobs_by_tokens(1) == {"b": [-0.5, -1.5]}  # step 2 only; the keyless row left out
    with sqlite3.connect(path) as conn:  # as a store from before the column: the table without it
        conn.execute("DROP TABLE teacher_logprobs")
        conn.execute(
            "CREATE TABLE teacher_logprobs (step INTEGER NOT NULL, prompt_index INTEGER NOT NULL, completion_index "
            "INTEGER NOT NULL, logprob BLOB NOT NULL, PRIMARY KEY (step, prompt_index, completion_index))"
        )
        conn.execute("INSERT INTO teacher_logprobs VALUES (2, 0, 0, ?)", (encode([-2.0]),))
    with RolloutStore(path, readonly=True) as store:
        assert store.teacher_logprobs_by_tokens(0) == {}  # no column: nothing to replay
    with RolloutStore(path, run_id="run") as store:  # opened for writing: the column is added
        store.write_step(3, [record(0, "c")], {})
        assert store.teacher_logprobs_by_tokens(0) == {"c": [-0.5, -1.5]}
        assert store.teacher_logprobs(2) == {(2, 0, 0): [-2.0]}
