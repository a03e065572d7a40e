"""grpokit.data.prompt_builder: prompts built from a dataset's columns by the config (prompt_template, system_prompt,
use_chat_template), the other columns kept for the reward functions."""

from __future__ import annotations

import pytest

from grpokit.compose.specs import prompt_builder
from grpokit.config import GRPOConfig
from grpokit.data.prompts import DataError, PromptBuilder, load_rows, reward_inputs

ROWS = [{"question": "Tom has 3 apples and buys 4. How many?", "answer": "3 + 4 = 7\n#### 7"}]
TEMPLATE = "{question}\nAnswer after ####."


def builder(**given) -> PromptBuilder:
    """A PromptBuilder on the ``prompt`` column with nothing set, then ``given``."""
    return PromptBuilder(**{"column": "prompt", "template": None, "system_prompt": None, "chat": None, **given})


def test_nothing_set_leaves_the_rows_alone():
    rows = [{"prompt": "2+2=", "answer": "4"}]
    assert builder().apply(rows) is rows
    assert not prompt_builder(GRPOConfig()).active


def test_template_and_system_prompt_make_chat_messages():
    cfg = GRPOConfig(prompt_template=TEMPLATE, system_prompt="You are a careful tutor.")
    rows = load_rows(ROWS, cfg.prompt_column, prompts=prompt_builder(cfg))
    assert rows[0]["prompt"] == [
        {"role": "system", "content": "You are a careful tutor."},
        {"role": "user", "content": "Tom has 3 apples and buys 4. How many?\nAnswer after ####."},
    ]
    # the reward functions get every other column, the source question included
    columns = reward_inputs(rows, [0], 2, "prompt", [5, 6])
    assert columns == {
        "question": [ROWS[0]["question"]] * 2,
        "answer": [ROWS[0]["answer"]] * 2,
        "completion_lengths": [5, 6],
    }
    assert ROWS[0] == {"question": "Tom has 3 apples and buys 4. How many?", "answer": "3 + 4 = 7\n#### 7"}  # untouched


def test_plain_text_and_the_prompt_column_as_user_message():
    text = builder(template=TEMPLATE, system_prompt="Be brief.", chat=False).build(ROWS[0])
    assert text == "Be brief.\n\nTom has 3 apples and buys 4. How many?\nAnswer after ####."
    assert builder(template="Q: {question} {{no column}}", chat=False).build(ROWS[0]) == (
        "Q: Tom has 3 apples and buys 4. How many? {no column}"  # literal braces doubled
    )
    # use_chat_template alone: the prompt column becomes a user message for the chat template
    assert builder(column="question", chat=True).build(ROWS[0]) == [{"role": "user", "content": ROWS[0]["question"]}]
    # chat messages in the data keep their turns; the system prompt goes first
    messages = [{"role": "user", "content": "hi"}]
    assert builder(system_prompt="S").build({"prompt": messages}) == [
        {"role": "system", "content": "S"},
        *messages,
    ]
    assert builder(template="{item[name]} of {item[n]}", chat=False).columns() == ["item"]
    assert builder(template="{item[name]} of {item[n]}", chat=False).build({"item": {"name": "a", "n": 2}}) == (
        "a of 2"
    )


def test_bad_rows_get_one_line_naming_the_fix():
    with pytest.raises(
        DataError, match=r"prompt_template names the column 'questoin', which train_dataset row 0 lacks "
    ):
        builder(template="{questoin}").apply(ROWS)
    with pytest.raises(DataError, match=r"Did you mean 'question'\?"):
        builder(template="{questoin}").apply(ROWS)
    with pytest.raises(DataError, match=r"eval_dataset row 0 has no 'prompt' column .* data\.prompt_template"):
        builder(system_prompt="S").apply(ROWS, "eval_dataset")
    with_system = [{"prompt": [{"role": "system", "content": "x"}, {"role": "user", "content": "y"}]}]
    with pytest.raises(DataError, match=r"row 0 has a system message already and system_prompt is set"):
        builder(system_prompt="S").apply(with_system)
    with pytest.raises(DataError, match=r"holds chat messages but use_chat_template is false"):
        builder(chat=False).apply(with_system)
    with pytest.raises(DataError, match=r"prompt_template '\{item\[9\]\}' failed on it"):
        builder(template="{item[9]}").apply([{"item": [1]}])


def test_config_checks_the_template():
    from grpokit.config import ConfigError

    with pytest.raises(ConfigError, match=r"not a valid format string .* literal braces as \{\{ and \}\}"):
        GRPOConfig(prompt_template="{question")
    for template in ("Solve it.", "{} then {0}"):
        with pytest.raises(ConfigError, match=r"names no column; put the column in braces"):
            GRPOConfig(prompt_template=template)
