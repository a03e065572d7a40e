"""The ``accuracy`` reward: answer extraction, normalisation, math-verify and its fallback."""

import sys

import pytest

from grpokit.rewards import MissingColumnError, RewardError, get_reward
from grpokit.rewards.math import AccuracyReward, extract_answer, normalise, reference_answer


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (r"so \boxed{42}.", "42"),
        (r"\boxed{\frac{1}{2}}", r"\frac{1}{2}"),  # nested braces
        (r"first \boxed{1} then \boxed{2}", "2"),  # the last box wins
        (r"\boxed{3} but cut: \boxed{4", "3"),  # an unclosed box is skipped
        ("Natalia sold 48 + 24 = 72 clips.\n#### 72", "72"),
        ("#### 1,000\n", "1,000"),
        ("<answer> 7 </answer>", "7"),
        ("<answer>1</answer> and <answer>x+1</answer>", "x+1"),
        (r"<answer>\boxed{5}</answer> #### 6", "5"),  # boxed before #### before tags
        ("I think it is 3, no, -12.5 in the end", "-12.5"),
        ("5-3 gives 2", "2"),
        ("10-3", "3"),  # subtraction, not the number -3
        ("costs 1,234 dollars", "1,234"),
        ("about 3/4 of it", "3/4"),
        ("no digits at all", None),
        ("", None),
    ],
)
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (" $1,000.50 $", "1000.5"),
        ("5.0", "5"),
        ("-2.500", "-2.5"),
        ("x + 1", "x+1"),
        ("42.", "42"),
        ("12,34", "12,34"),  # not a thousands group: left alone
    ],
)
def test_normalise(raw, expected):
    assert normalise(raw) == expected


def test_reference_answer():
    assert reference_answer("She has 3 + 4 = 7.\n#### 7") == "7"
    assert reference_answer(r"\frac{1}{2}") == r"\frac{1}{2}"  # used whole, not its last number
    assert reference_answer(12) == "12"
    assert reference_answer(None) is None
    assert reference_answer("   ") is None


@pytest.mark.parametrize(
    ("completion", "reference", "reward"),
    [
        (r"The answer is \boxed{\frac{1}{2}}", "0.5", 1.0),  # LaTeX fraction vs decimal
        (r"\boxed{0.5}", r"\frac{1}{2}", 1.0),
        (r"\boxed{\dfrac{3}{4}}", "0.75", 1.0),
        ("so it is 1/2", "0.5", 1.0),
        ("Total: 48 + 24 = 72\n#### 72", "72", 1.0),
        ("#### 71", "72", 0.0),
        ("<answer>-3</answer>", "-3", 1.0),  # negative numbers
        ("<answer>3</answer>", "-3", 0.0),
        ("the temperature fell to -7 degrees", "-7", 1.0),
        ("we get 5.0", "5", 1.0),  # trailing .0
        ("it costs $1,000", "1000", 1.0),  # thousands comma and dollar sign
        (r"\boxed{\sqrt{2}}", "2^{1/2}", 1.0),  # symbolic equivalence
        (r"\boxed{x+1}", "1+x", 1.0),
        ("I give up", "4", 0.0),  # no number at all
        ("", "4", 0.0),  # empty completion
        ("3 apples and then 4", "3", 0.0),  # the last number is the answer
        ("#### 18", "Janet sells 16 - 3 - 4 = 9 eggs, 9 * 2 = 18.\n#### 18", 1.0),  # GSM8K column
    ],
)
def test_accuracy(completion, reference, reward):
    assert get_reward("accuracy")([""], [completion], answer=[reference]) == [reward]


def test_accuracy_without_reference_is_none():
    fn = get_reward("accuracy")
    assert fn(["", "", ""], ["1", "2", "3"], answer=[None, "", "3"]) == [None, None, 1.0]


def test_accuracy_answer_column_param_and_unused_columns():
    fn = get_reward("accuracy", answer_column="solution")
    assert fn(["q"], [r"\boxed{9}"], solution=["9"], answer=["0"], extra=[1]) == [1.0]


def test_accuracy_missing_column_names_it():
    fn = get_reward("accuracy", answer_column="solution")
    with pytest.raises(MissingColumnError, match="'solution'") as info:
        fn(["q"], ["1"], answer=["1"])
    # One error that is both a KeyError (what went wrong) and a RewardError (stops the run).
    assert isinstance(info.value, KeyError) and isinstance(info.value, RewardError)
    assert "answer" in str(info.value)  # lists the columns that were given


def test_accuracy_fallback_without_math_verify(monkeypatch):
    # A None entry in sys.modules makes `import math_verify` raise ImportError.
    monkeypatch.setitem(sys.modules, "math_verify", None)
    fn = get_reward("accuracy")
    completions = [r"\boxed{\frac{1}{2}}", "1,000", "5.0", r"\boxed{\frac{1}{2}}", "4"]
    references = ["0.5", "1000", "5", r"\frac{1}{2}", "5"]
    # Exact match after normalisation still works; LaTeX-vs-decimal needs math-verify.
    assert fn([""] * 5, completions, answer=references) == [0.0, 1.0, 1.0, 1.0, 0.0]


def test_accuracy_says_at_start_when_it_falls_back_to_exact_match(monkeypatch):
    """Without the math extra the reward still works (exact match), and says so when it is built: the start of a
    run, not the middle of its flat curves."""
    from grpokit.rewards import math as math_reward

    monkeypatch.setitem(sys.modules, "math_verify", None)  # import math_verify raises ImportError
    math_reward.math_verify_installed.cache_clear()
    try:
        with pytest.warns(
            UserWarning,
            match=r"^grpokit: reward accuracy: math-verify is not installed, so answers "
            r"are compared by exact match only .* pip install 'grpokit\[math\]'",
        ):
            reward = AccuracyReward()
        assert reward(["p", "p"], ["\\boxed{1,000}", "\\boxed{0.5}"], answer=["1000", "\\frac{1}{2}"]) == [1.0, 0.0]
    finally:
        math_reward.math_verify_installed.cache_clear()


def test_accuracy_with_math_verify_installed_says_nothing(recwarn):
    AccuracyReward()
    assert not [w for w in recwarn if "math-verify" in str(w.message)]
