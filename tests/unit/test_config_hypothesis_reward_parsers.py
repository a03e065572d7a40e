"""Property tests of the reward parsers: on arbitrary text they never raise, and they find an
answer that was put in a known place."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from grpokit.rewards.format import FormatReward
from grpokit.rewards.length import overlong_penalty, target_length_penalty
from grpokit.rewards.math import (
    AccuracyReward,
    extract_answer,
    normalise,
    reference_answer,
)

TEXT = st.text(max_size=60)
# text built from the characters the parsers look for, so the odd cases are actually reached
MATHY = st.text(st.sampled_from(list("0123456789-+*/^.,$ {}()\\boxedfrac#<>/answer\n")), max_size=60)
ANY = TEXT | MATHY


def without(*fragments: str):
    return ANY.filter(lambda t: not any(f in t for f in fragments))


@settings(max_examples=500, deadline=None)
@given(ANY)
def test_extract_and_reference_never_raise(text):
    answer = extract_answer(text)
    assert answer is None or isinstance(answer, str)
    reference = reference_answer(text)
    assert reference is None or (isinstance(reference, str) and reference != "")


@settings(max_examples=300, deadline=None)
@given(without("box"), without("{", "}"), without("box"))
def test_last_boxed_answer_is_found(before, inside, after):
    assert extract_answer(before + "\\boxed{" + inside + "}" + after) == inside.strip()


@settings(max_examples=300, deadline=None)
@given(without("box", "#"), without("box", "\n"))
def test_gsm8k_hashes_answer_is_found(before, line):
    assert extract_answer(before + "\n#### " + line) == line.strip()


@settings(max_examples=300, deadline=None)
@given(without("box", "#", "<answer>"), without("box", "#", "answer>"), without("box", "#", "<answer>"))
def test_answer_tag_is_found(before, inside, after):
    assert extract_answer(before + "<answer>" + inside + "</answer>" + after) == inside.strip()


@settings(max_examples=300, deadline=None)
@given(
    st.text(st.characters(exclude_categories=("Nd",)), max_size=30).filter(
        lambda t: not any(f in t for f in ("box", "#", "<answer>"))
    ),
    st.integers(-(10**6), 10**6),
)
def test_last_number_is_the_fallback(before, number):
    assert extract_answer(before + " " + str(number)) == str(number)


@settings(max_examples=500, deadline=None)
@given(ANY)
def test_normalise_is_idempotent_and_drops_spaces_and_dollars(text):
    once = normalise(text)
    assert normalise(once) == once
    assert "$" not in once and not any(c.isspace() for c in once)


@settings(max_examples=150, deadline=None)
@given(ANY, ANY)
def test_accuracy_score_is_none_zero_or_one(completion, reference):
    assert AccuracyReward.score(completion, reference) in (None, 0.0, 1.0)


@settings(max_examples=150, deadline=None)
@given(without("{", "}", "#", "<answer>", "box").filter(lambda t: t.strip()))
def test_a_boxed_reference_is_its_own_correct_answer(answer):
    assert AccuracyReward.score("so \\boxed{" + answer + "}", answer) == 1.0


@settings(max_examples=300, deadline=None)
@given(st.lists(ANY, min_size=1, max_size=4))
def test_format_reward_on_any_text(completions):
    scores = FormatReward()(["p"] * len(completions), completions)
    assert len(scores) == len(completions) and set(scores) <= {0.0, 1.0}


@settings(max_examples=300, deadline=None)
@given(without("think>", "answer>"), without("think>", "answer>"))
def test_format_reward_accepts_the_think_answer_layout(thought, answer):
    assert FormatReward()(["p"], [f"<think>{thought}</think>\n<answer>{answer}</answer>"]) == [1.0]


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 10**6), st.integers(1, 10**4), st.integers(0, 10**4))
def test_length_penalties_stay_in_range(length, cache, extra):
    # overlong: 0 up to max - cache, then a linear ramp to -1 at max, -1 beyond
    max_length = cache + extra
    penalty = overlong_penalty(length, max_length, cache)
    assert -1.0 <= penalty <= 0.0
    assert (penalty == 0.0) == (length <= extra)
    assert -1.0 <= target_length_penalty(length, cache) <= 0.0


SMILES = st.text(st.sampled_from(list("CNOSPFBrIcnos()=#[]@+-123456789%Hl/\\. ")), max_size=30)


@pytest.mark.parametrize("metric", ["validity", "qed", "sa"])
def test_molecule_reward_on_any_smiles_text(metric):
    pytest.importorskip("rdkit")
    from grpokit.rewards.molecule import MoleculeReward

    reward = MoleculeReward(metric)

    @settings(max_examples=200, deadline=None)
    @given(st.lists(SMILES | TEXT, min_size=1, max_size=4))
    def check(completions):
        scores = reward(["p"] * len(completions), completions)
        assert len(scores) == len(completions)
        assert all(isinstance(s, float) for s in scores)

    check()
