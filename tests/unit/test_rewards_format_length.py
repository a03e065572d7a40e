"""The ``format`` and ``length`` rewards."""

import pytest

from grpokit.rewards import MissingColumnError, get_reward
from grpokit.rewards.length import overlong_penalty, target_length_penalty


@pytest.mark.parametrize(
    ("completion", "reward"),
    [
        ("<think>work</think><answer>4</answer>", 1.0),
        ("  <think>a\nb</think>\n<answer>\n4\n</answer>\n", 1.0),  # newlines and outer spaces
        ("<think></think><answer></answer>", 1.0),
        ("<answer>4</answer>", 0.0),  # no think block
        ("<think>work</think>", 0.0),  # no answer
        ("<answer>4</answer><think>work</think>", 0.0),  # wrong order
        ("<think>a</think><answer>4</answer> trailing text", 0.0),
        ("<think>a</think><think>b</think><answer>4</answer>", 0.0),  # two think blocks
        ("<think>a<answer>4</answer>", 0.0),  # unclosed think
        ("", 0.0),
    ],
)
def test_format_think_answer_layout(completion, reward):
    assert get_reward("format")([""], [completion]) == [reward]
    assert get_reward("format", layout="think_answer")([""], [completion]) == [reward]


def test_format_pattern_fullmatch_and_search():
    completions = ["Answer: 12", "so... Answer: 12", "Answer:\n12", "Answer: twelve"]
    full = get_reward("format", pattern=r"Answer:\s*\d+")
    search = get_reward("format", pattern=r"Answer:\s*\d+", mode="search")
    assert full([""] * 4, completions) == [1.0, 0.0, 1.0, 0.0]
    assert search([""] * 4, completions) == [1.0, 1.0, 1.0, 0.0]
    dotall = get_reward("format", pattern=r"<a>.*</a>")
    assert dotall([""], ["<a>line\nline</a>"]) == [1.0]  # '.' crosses newlines


@pytest.mark.parametrize(
    "params",
    [
        {"pattern": "x", "layout": "think_answer"},
        {"layout": "nope"},
        {"pattern": "(unclosed"},
        {"mode": "match"},
    ],
)
def test_format_rejects_bad_params(params):
    with pytest.raises(ValueError):
        get_reward("format", **params)


# DAPO eq. 13 with L_max = 20, L_cache = 4, so the soft limit is 16:
#   |y| = 10 -> 0;  16 -> 0;  17 -> (16 - 17) / 4 = -0.25;  18 -> -0.5;  20 -> -1;  21 -> -1.
@pytest.mark.parametrize(
    ("length", "reward"),
    [(0, 0.0), (10, 0.0), (16, 0.0), (17, -0.25), (18, -0.5), (20, -1.0), (21, -1.0)],
)
def test_overlong_penalty_hand_values(length, reward):
    assert overlong_penalty(length, max_length=20, cache_length=4) == reward


# target 10: |5 - 10| / 10 = 0.5 -> -0.5;  12 -> -0.2;  10 -> 0;  25 -> -1.5, clipped to -1.
@pytest.mark.parametrize(("length", "reward"), [(5, -0.5), (12, -0.2), (10, 0.0), (25, -1.0), (0, -1.0)])
def test_target_length_penalty_hand_values(length, reward):
    assert target_length_penalty(length, 10) == pytest.approx(reward)


def test_length_units():
    completions = ["a" * 18, "b" * 3]
    tokens = {"completion_lengths": [3, 17]}
    dapo = {"max_length": 20, "cache_length": 4}
    # chars: 18 -> -0.5, 3 -> 0; tokens: 3 -> 0, 17 -> -0.25.
    assert get_reward("length", **dapo)(["", ""], completions) == [-0.5, 0.0]
    assert get_reward("length", **dapo)(["", ""], completions, **tokens) == [0.0, -0.25]
    assert get_reward("length", unit="tokens", **dapo)(["", ""], completions, **tokens) == [
        0.0,
        -0.25,
    ]
    assert get_reward("length", unit="chars", **dapo)(["", ""], completions, **tokens) == [
        -0.5,
        0.0,
    ]
    with pytest.raises(MissingColumnError, match="completion_lengths"):
        get_reward("length", unit="tokens", **dapo)(["", ""], completions)


def test_length_target_mode():
    # chars 5 and 15 against target 10: -0.5 each.
    assert get_reward("length", target_length=10)(["", ""], ["x" * 5, "x" * 15]) == [-0.5, -0.5]


@pytest.mark.parametrize(
    "params",
    [
        {},
        {"max_length": 20},
        {"max_length": 20, "cache_length": 0},
        {"max_length": 20, "cache_length": 21},
        {"max_length": 20, "cache_length": 4, "target_length": 10},
        {"target_length": 0},
        {"target_length": 10, "unit": "words"},
    ],
)
def test_length_rejects_bad_params(params):
    with pytest.raises(ValueError):
        get_reward("length", **params)
