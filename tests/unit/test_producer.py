"""The producers' thread and scoring threads of rollouts sampled ahead (grpokit/train/experience/producer.py)."""

from __future__ import annotations

import threading

import pytest

from grpokit.train.experience.producer import Producer


def test_jobs_are_sampled_in_order_and_scored_up_to_scorers_at_once():
    order, together = [], threading.Barrier(2, timeout=120)  # generous: only fails when the two never meet
    producer = Producer(scorers=2)

    def sample(key):
        def run():
            order.append(key)
            return key * 10

        return run

    def score(sampled):
        together.wait()  # both batches are being scored at the same time, or this raises BrokenBarrierError
        return sampled + 1

    for key in (1, 2):
        producer.admit(key, sample(key), score)
    assert producer.take(2) == (20, 21) and producer.take(1) == (10, 11)
    assert order == [1, 2]
    waits = producer.counters()
    assert set(waits) == {"learner_wait", "producer_wait"} and min(waits.values()) >= 0
    producer.close()


def test_a_failure_is_raised_where_the_result_is_taken():
    producer = Producer()

    def broken():
        raise OSError("sampler lost")

    producer.admit(1, broken, lambda s: s)
    producer.admit(2, lambda: 1, lambda s: 1 / 0)
    producer.settle()  # waits for both, raises nothing
    with pytest.raises(OSError, match="sampler lost"):
        producer.take(1)
    with pytest.raises(ZeroDivisionError):
        producer.take(2)
    with pytest.raises(RuntimeError, match="no job 3"):
        producer.take(3)
    producer.close()
