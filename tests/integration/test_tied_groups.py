"""A run whose reward cannot tell completions apart says so (warn_tied_steps), naming the functions and values."""

from __future__ import annotations

import json

import pytest
import yaml
from shared_helpers import WORDS

from grpokit.cli import main


@pytest.mark.slow
def test_a_run_where_every_group_ties_warns_once(tmp_path, tiny_model_dir, capsys):
    """A constant reward: every group ties on every step; the warning comes on step 2 (warn_tied_steps: 2), names
    the reward and its one value, and is not repeated on step 3 of the same streak."""
    rewards = tmp_path / "constant.py"
    rewards.write_text("def constant(completions, **kw):\n    return [0.5 for _ in completions]\n")
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"prompt": " ".join(WORDS[i : i + 4])}) + "\n" for i in range(8)))
    config = tmp_path / "config.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "model": {"model_name_or_path": str(tiny_model_dir)},
                "data": {"train_dataset": str(data)},
                "algo": {"num_generations": 2},
                "generation": {"max_completion_length": 4},
                "optim": {"per_device_train_batch_size": 4, "max_steps": 3},
                "run": {
                    "output_dir": str(tmp_path / "run"),
                    "progress_bar": False,
                    "report_to": ["jsonl"],
                    "save_strategy": "no",
                    "warn_tied_steps": 2,
                },
                "rewards": [f"{rewards}:constant"],
            }
        )
    )
    assert main(["train", str(config)]) == 0
    err = capsys.readouterr().err
    warnings = [line for line in err.splitlines() if "got the same reward" in line]
    assert warnings == [
        "steps 1-2: in every group all 2 completions got the same reward, so the advantages were 0 and nothing was "
        "learned from the rewards (constant gave 0.5). Check that the reward functions can tell completions apart on "
        "this data and model (its column, its format); warn_tied_steps: 0 turns this warning off."
    ]
