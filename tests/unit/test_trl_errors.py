"""TRL's errors where TRL's own tests match their words: the same exception type (grpokit's ConfigError and
DataError are ValueErrors), TRL's key phrase, and grpokit's fix on the same line. All are raised before any model
loads (the model path does not exist), except an unknown environment, which only a batch's rows reveal."""

from __future__ import annotations

import pytest
from shared_helpers import tiny_args

from grpokit import GRPOTrainer


def length(completions, **kwargs):
    return [float(len(c)) for c in completions]


ROWS = [{"prompt": f"p{i}"} for i in range(8)]


@pytest.fixture
def args(tmp_path):
    return tiny_args(tmp_path / "run", max_steps=1)


def test_no_reward_source(tmp_path, args):
    with pytest.raises(ValueError, match=r"No reward source provided: pass reward_funcs=\.\.\. or list them"):
        GRPOTrainer(str(tmp_path / "no-such-model"), args=args, train_dataset=ROWS)


def test_reward_processing_classes_one_per_reward_function(tmp_path, args):
    # TRL reads one processing class as a list of one: with two reward models it must be a list of two
    tokenizer = object()
    with pytest.raises(ValueError, match=r"reward processing classes \(1\) must match the number of reward functions"):
        GRPOTrainer(
            str(tmp_path / "no-such-model"),
            ["owner/reward-model-a", "owner/reward-model-b"],  # never loaded: the count is checked first
            args=args,
            train_dataset=ROWS,
            reward_processing_classes=tokenizer,
        )
    with pytest.raises(ValueError, match=r"\(3\) must match the number of reward functions \(2\); pass .* one entry"):
        GRPOTrainer(
            str(tmp_path / "no-such-model"),
            [length, length],
            args=args,
            train_dataset=ROWS,
            reward_processing_classes=[None, None, None],
        )


def test_an_unknown_bare_reward_name_is_a_builtin_typo_not_a_hub_id(tmp_path, args):
    with pytest.raises(ValueError, match=r"rewards: unknown reward 'acuracy'; did you mean 'accuracy'\?"):
        GRPOTrainer(str(tmp_path / "no-such-model"), "acuracy", args=args, train_dataset=ROWS)


def test_an_unknown_environment_in_a_row():
    from grpokit.tools.environment import Environments

    class Counter:
        def reset(self, **row):
            return None

    environments = Environments({"counter": Counter})
    with pytest.raises(ValueError, match=r"environment='unknown', which is not among the environments"):
        environments.sessions([{"prompt": "p", "environment": "unknown"}])
