"""The store's digest chain and the resume's check against it: every kind of damage is one StoreError naming the
file; a full disk while writing a step is one StoreError naming ENOSPC."""

from __future__ import annotations

import sqlite3

import pytest

from grpokit.store import RolloutRecord, RolloutStore, StoreError
from grpokit.store.integrity import EMPTY_CHAIN, check_store, next_chain


def record(i: int, completion: str = "w1 w7") -> RolloutRecord:
    return RolloutRecord(
        prompt_index=i // 2,
        completion_index=i % 2,
        prompt="w0 w1 w2",
        completion=completion,
        prompt_tokens=3,
        completion_tokens=2,
        finish_reason="stop",
        rewards={"target": 0.5},
        reward=0.5,
        advantage=0.125 * i,
        policy_version=0,
        error=None,
    )


def written_store(path, steps: int = 3) -> str:
    """A store of ``steps`` steps; returns the chain a RunLog keeps while writing them."""
    chain = EMPTY_CHAIN
    with RolloutStore(path) as store:
        for step in range(1, steps + 1):
            store.write_step(step, [record(i, f"step {step} completion {i}") for i in range(4)], {"kl": 0.1 * step})
            chain = next_chain(chain, store.step_digest(step))
        store.write_eval(1, "eval", {"pass@1": 0.5})  # evaluations are outside the chain
    return chain


def test_the_check_recomputes_the_chain_kept_while_writing(tmp_path):
    path = tmp_path / "rollouts.sqlite"
    chain = written_store(path)
    assert check_store(path, 1, 3, chain, "step-3") == chain
    assert check_store(path, 1, 3, None, "step-3") == chain  # no record: the steps are checked, not the values
    assert check_store(path, 1, 2, None, "step-2") != chain


def flip_bit_in(path, text: bytes) -> None:
    data = bytearray(path.read_bytes())
    data[data.index(text)] ^= 0x01  # 's' -> 'r': a stored value changed, the file's structure intact
    path.write_bytes(bytes(data))


def update(path, sql: str) -> None:
    with sqlite3.connect(path) as db:
        db.execute(sql)


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda p: p.unlink(), r"rollouts.sqlite is missing, but checkpoint step-3 needs its steps 1..3"),
        (lambda p: p.write_bytes(b""), r"rollouts.sqlite is empty \(0 bytes\), but checkpoint step-3 needs"),
        (lambda p: p.write_bytes(p.read_bytes()[:4096]), r"rollouts.sqlite is damaged"),
        (lambda p: p.write_bytes(b"not a database" * 300), r"rollouts.sqlite is damaged \(file is not a database\)"),
        (lambda p: flip_bit_in(p, b"step 2 completion 3"), r"does not hold what checkpoint step-3 recorded"),
        (lambda p: update(p, "DELETE FROM steps WHERE step = 2"), r"lacks step 2 of the steps 1..3"),
        (lambda p: update(p, "UPDATE step_metrics SET value = 0.5 WHERE step = 3"), r"does not hold what"),
        (lambda p: update(p, "DROP TABLE step_metrics"), r"is not a grpokit rollout store"),
    ],
)
def test_damage_is_one_error_naming_the_store(tmp_path, damage, message):
    path = tmp_path / "rollouts.sqlite"
    chain = written_store(path)
    damage(path)
    with pytest.raises(StoreError, match=message):
        check_store(path, 1, 3, chain, "step-3")


def test_a_full_disk_while_writing_a_step_is_one_line_naming_enospc(tmp_path):
    with RolloutStore(tmp_path) as store:
        store.write_step(1, [record(0)], {"kl": 0.1})
        pages = store._conn.execute("PRAGMA page_count").fetchone()[0]
        store._conn.execute(f"PRAGMA max_page_count = {pages}")  # SQLite's own 'database or disk is full'
        with pytest.raises(StoreError) as caught:
            store.write_step(2, [record(i, "x" * 5000) for i in range(4)], {"kl": 0.2})
        assert str(caught.value) == (
            f"cannot write step 2 to {store.path}: No space left on device (ENOSPC; SQLite: database or disk is "
            "full); the steps before it are intact: fix that, then resume with resume_from=latest."
        )
        assert store.steps() == [1]
