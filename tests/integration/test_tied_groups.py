"""A run whose reward cannot tell completions apart says so (warn_tied_steps), naming the functions and values."""

from __future__ import annotations

import pytest
from shared_helpers import tiny_run_config, word_prompts

from grpokit.cli import main


@pytest.mark.slow
def test_a_run_where_every_group_ties_warns_once(tmp_path, tiny_model_dir, capsys):
    """A constant reward: every group ties on every step; the warning comes on step 2 (warn_tied_steps: 2), names
    the reward and its one value, and is not repeated on step 3 of the same streak."""
    rewards = tmp_path / "constant.py"
    rewards.write_text("def constant(completions, **kw):\n    return [0.5 for _ in completions]\n")
    config = tiny_run_config(
        tmp_path,
        tiny_model_dir,
        max_steps=3,
        num_generations=2,
        rewards=[f"{rewards}:constant"],
        prompts=word_prompts(8, 4, target=None),
        run={"save_strategy": "no", "warn_tied_steps": 2},
    )
    assert main(["train", str(config)]) == 0
    err = capsys.readouterr().err
    warnings = [line for line in err.splitlines() if "got the same reward" in line]
    assert warnings == [
        "steps 1-2: in every group all 2 completions got the same reward, so the advantages were 0 and nothing was "
        "learned from the rewards (constant gave 0.5). Check that the reward functions can tell completions apart on "
        "this data and model (its column, its format); warn_tied_steps: 0 turns this warning off."
    ]
