"""PromptSource: seeded order, distinct prompts per step, resumable position."""

import pytest

from grpokit.data.prompts import DataError, PromptSource
from grpokit.testing import build_word_tokenizer


def source(n: int, **kw) -> PromptSource:
    tokenizer = build_word_tokenizer(["a", "b"])
    return PromptSource([{"prompt": "a b"} for _ in range(n)], tokenizer, **kw)


def test_batches_never_repeat_a_prompt_even_across_epochs():
    src = source(10, seed=3)
    for _ in range(20):  # 10 prompts, 4 per batch: every third batch would wrap
        batch = src.next_indices(4)
        assert len(set(batch)) == 4


def test_each_epoch_is_a_new_permutation_and_the_position_resumes():
    src = source(10, seed=3)
    first_epoch = src.next_indices(5) + src.next_indices(5)
    assert sorted(first_epoch) == list(range(10))
    state = src.state_dict()
    expected = src.next_indices(5)
    again = source(10, seed=3)
    again.load_state_dict(state)
    assert again.next_indices(5) == expected and state == {"epoch": 0, "position": 10}


def test_too_few_prompts_for_a_step_is_a_clear_error():
    with pytest.raises(DataError, match="a step needs 6 distinct prompts but only 5 are usable"):
        source(5).next_indices(6)
