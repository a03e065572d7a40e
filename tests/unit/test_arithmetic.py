"""The built-in arithmetic task: splits, answers, rewards."""

import pytest

from grpokit.data.arithmetic import (
    arithmetic_correct,
    arithmetic_format,
    arithmetic_splits,
    first_integer,
    make_problem,
)


def test_make_problem_prompt_and_answer():
    assert make_problem(23, "+", 45) == {"prompt": "23+45=", "answer": "68"}
    assert make_problem(3, "-", 7) == {"prompt": "3-7=", "answer": "-4"}
    assert make_problem(12, "*", 11) == {"prompt": "12*11=", "answer": "132"}
    with pytest.raises(ValueError, match="unknown operator"):
        make_problem(1, "/", 2)


def test_splits_are_deterministic_and_seed_dependent():
    assert arithmetic_splits(seed=3) == arithmetic_splits(seed=3)
    assert arithmetic_splits(seed=3)[1] != arithmetic_splits(seed=4)[1]


def test_splits_are_disjoint_and_cover_every_problem():
    train, held_out = arithmetic_splits(seed=0, max_operand=9, operators="+-", n_eval=40)
    # 10 * 10 operand pairs for each of 2 operators
    assert len(train) == 160 and len(held_out) == 40
    train_prompts = {r["prompt"] for r in train}
    eval_prompts = {r["prompt"] for r in held_out}
    assert not train_prompts & eval_prompts
    assert len(train_prompts | eval_prompts) == 200


def test_every_answer_is_right():
    train, held_out = arithmetic_splits(max_operand=12, operators="+-*", n_eval=50)
    for row in train + held_out:
        a, op, b = _parse(row["prompt"])
        assert int(row["answer"]) == {"+": a + b, "-": a - b, "*": a * b}[op]


def _parse(prompt):
    body = prompt.rstrip("=")
    for op in "+*":
        if op in body:
            a, b = body.split(op)
            return int(a), op, int(b)
    a, b = body.split("-")
    return int(a), "-", int(b)


def test_splits_reject_bad_sizes():
    with pytest.raises(ValueError, match="n_eval"):
        arithmetic_splits(max_operand=2, n_eval=9)  # only 9 problems: nothing left to train on
    with pytest.raises(ValueError, match="max_operand"):
        arithmetic_splits(max_operand=-1)


def test_first_integer():
    assert first_integer("68") == 68
    assert first_integer("  -4 is it") == -4
    assert first_integer("x=12, y=3") == 12
    assert first_integer("none") is None


def test_correct_reward_hand_cases():
    completions = ["68", " 68", "68 apples", "068", "680", "6 8", "", "-68", "67"]
    rewards = arithmetic_correct([""] * len(completions), completions, ["68"] * len(completions))
    assert rewards == [1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    assert arithmetic_correct(["3-7="], ["-4"], ["-4"]) == [1.0]


def test_correct_reward_needs_one_answer_per_completion():
    with pytest.raises(ValueError):
        arithmetic_correct(["", ""], ["1", "2"], ["1"])


def test_format_reward_hand_cases():
    completions = ["68", " 68 ", "-4", "68?", "68 apples", "", "six"]
    assert arithmetic_format([""] * len(completions), completions) == [1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0]
