"""TRL's rollout_func contract in grpokit's terms (grpokit/rollout/rollout_func.py): the output's checks, its
conversion to Rollouts on hand-written ids, the engine's call (each prompt G times, adjacent), and the reward columns
carried through the joins and takes of dynamic sampling."""

from __future__ import annotations

import math

import pytest
import torch
from shared_helpers import sampling_params

from grpokit.rollout.rollout_func import RolloutFuncEngine, check_output, rollouts_from_output
from grpokit.rollout.seeding import concat_rollouts, split_rollouts
from grpokit.train.experience.trajectory import take_rows

EOS, PAD = 2, 0


def output(**changes):
    """Two prompts ([10, 11] and [12]), two completions each (G = 2), max_completion_length 3 in the tests."""
    values = {
        "prompt_ids": [[10, 11], [10, 11], [12], [12]],
        "completion_ids": [[5, 6, EOS], [5, 6, 7], [8], [9, 9, 9, 9]],
        "logprobs": [[-0.1, -0.2, -0.3], [-0.4, None, -0.6], [-0.7], [-1.0, -1.0, -1.0, -1.0]],
        "env_mask": [[1, 1, 1], [1, 0, 1], [1], [1, 0, 0, 1]],
        "env_score": [1.0, 0.0, 0.5, 0.25],
        "task": "count",  # not a list: the value of every row
    }
    return {**values, **changes}


def test_the_output_is_converted_to_rollouts_of_groups():
    checked = check_output(output(), num_prompts=4)
    assert checked.extra == {"env_score": [1.0, 0.0, 0.5, 0.25], "task": ["count"] * 4}  # env_mask is no column
    rollouts = rollouts_from_output(
        checked, num_generations=2, eos_token_ids=[EOS], pad_token_id=PAD, max_completion_length=3, policy_version=5
    )
    assert rollouts.prompt_ids == [[10, 11], [12]]  # one per group
    assert rollouts.num_generations == 2 and rollouts.policy_version == 5
    assert rollouts.completion_ids.tolist() == [[5, 6, EOS, PAD], [5, 6, 7, PAD], [8, PAD, PAD, PAD], [9, 9, 9, 9]]
    assert rollouts.completion_mask.tolist() == [[1, 1, 1, 0], [1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 1, 1]]
    # env_mask is the loss mask, padded with 0; the model's own tokens are what the length metrics count
    assert rollouts.loss_mask.tolist() == [[1, 1, 1, 0], [1, 0, 1, 0], [1, 0, 0, 0], [1, 0, 0, 1]]
    assert rollouts.sampled_lengths.tolist() == [3, 2, 1, 2]
    assert rollouts.completion_lengths.tolist() == [3, 3, 1, 4]
    # truncated: no EOS at the end and max_completion_length (3) tokens or more; a short one without EOS stopped
    assert rollouts.finish_reasons == ["stop", "length", "stop", "length"]
    logprobs = rollouts.logprobs
    assert logprobs.dtype == torch.float32 and logprobs[0, :3].tolist() == pytest.approx([-0.1, -0.2, -0.3])
    assert math.isnan(logprobs[1, 1]) and logprobs[2, 1:].tolist() == [0.0, 0.0, 0.0]  # None -> NaN, as TRL
    assert rollouts.columns == {"env_score": [1.0, 0.0, 0.5, 0.25], "task": ["count"] * 4}


def test_without_env_mask_there_is_no_loss_mask():
    values = output()
    del values["env_mask"]
    for given in (values, output(env_mask=None)):  # left out, or None as TRL reads it
        rollouts = rollouts_from_output(
            check_output(given, 4), num_generations=2, eos_token_ids=[EOS], pad_token_id=PAD, max_completion_length=3
        )
        assert rollouts.loss_mask is None and rollouts.sampled_lengths.tolist() == [3, 3, 1, 4]
        assert "env_mask" not in rollouts.columns


def test_missing_keys_are_named_as_trl_names_them():
    values = output()
    del values["logprobs"]
    with pytest.raises(ValueError, match=r"rollout_func must return keys \['logprobs'\] in its output dict\."):
        check_output(values, 4)
    with pytest.raises(ValueError, match="must return a dict"):
        check_output([[1]], 4)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"completion_ids": [[5], [6]]}, r"returned completion_ids 2 for 4 prompts.*num_generations times"),
        ({"env_score": [1.0]}, r"env_score 1 for 4 prompts"),
        ({"logprobs": [[-0.1], [-0.4, -0.5, -0.6], [-0.7], [-1.0] * 4]}, r"'logprobs' row 0 has 1 values for 3"),
        ({"env_mask": [[1, 1, 1], [1, 0, 1], [1, 1], [1, 0, 0, 1]]}, r"'env_mask' row 2 has 2 values for 1"),
        ({"env_mask": [[1, 1, 1], [1, 2, 1], [1], [1, 0, 0, 1]]}, r"'env_mask' row 1 holds"),
        ({"prompt_ids": [[10, 11], [10, 11], [12], [13]]}, r"different prompt_ids for rows 2 and 3.*group 1"),
        ({"completion_ids": [[5, "x"], [5, 6, 7], [8], [9, 9, 9, 9]]}, r"'completion_ids' row 0 is not a list"),
    ],
)
def test_wrong_shapes_are_named(changes, message):
    with pytest.raises(ValueError, match=message):
        checked = check_output(output(**changes), 4)
        rollouts_from_output(checked, num_generations=2, eos_token_ids=[EOS], pad_token_id=PAD, max_completion_length=3)


def test_the_engine_calls_with_each_prompt_num_generations_times():
    calls = []

    def call(prompts):
        calls.append(prompts)
        return check_output(output(), len(prompts))

    engine = RolloutFuncEngine(call, [EOS], PAD, seed=1)
    rollouts = engine.generate(["a", [{"role": "user", "content": "b"}]], 2, sampling_params(max_completion_length=3))
    assert calls == [["a", "a", [{"role": "user", "content": "b"}], [{"role": "user", "content": "b"}]]]
    assert rollouts.completion_ids.size(0) == 4 and rollouts.policy_version == 0
    engine.sync_weights()
    assert engine.generate(["a", "b"], 2, sampling_params(max_completion_length=3)).policy_version == 1
    with pytest.raises(ValueError, match=r"completion_ids 4,.* for 6 prompts"):  # G = 3: 6 prompts, 4 rows
        engine.call = lambda prompts: check_output(output(), len(prompts))
        engine.generate(["a", "b"], 3, sampling_params(max_completion_length=3))


def test_reward_columns_follow_splits_joins_and_takes():
    rollouts = rollouts_from_output(
        check_output(output(), 4), num_generations=2, eos_token_ids=[EOS], pad_token_id=PAD, max_completion_length=3
    )
    first, second = split_rollouts(rollouts, 2)
    assert first.columns == {"env_score": [1.0, 0.0], "task": ["count"] * 2}
    joined = concat_rollouts([second, first], PAD)
    assert joined.columns["env_score"] == [0.5, 0.25, 1.0, 0.0]
    assert joined.loss_mask.shape == (4, 4) and joined.conversations is None
    taken = take_rows(rollouts, torch.tensor([2, 3]))
    assert taken.columns == {"env_score": [0.5, 0.25], "task": ["count"] * 2} and taken.prompt_ids == [[12]]
