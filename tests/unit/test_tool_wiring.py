"""The trainer's side of multi-turn rollouts, piece by piece: the loss mask in the loss for every loss type,
splitting / joining / checkpointing Rollouts with their turns, the agent config section, the store's
conversation column (and old stores without it), and live `environments` kept out of reward processes."""

from __future__ import annotations

import dataclasses
import sqlite3

import pytest
import torch

from grpokit.algos.losses import policy_loss
from grpokit.compose.specs import update_inputs_spec
from grpokit.config import ConfigError, GRPOConfig
from grpokit.rewards import RewardRunner
from grpokit.rollout.seeding import concat_rollouts, split_rollouts
from grpokit.rollout.types import Conversation, Rollouts, Turn
from grpokit.store import RolloutStore
from grpokit.store.record import RolloutRecord, conversation_record
from grpokit.train.learning.learner import update_inputs


def multi_turn_rollouts(groups: int = 2, G: int = 2) -> Rollouts:
    """N = groups * G rollouts of 4 tokens: the model's, two a tool added, the model's again."""
    N = groups * G
    turns = [
        Turn("assistant", "call", (0, 1), tool_calls=[{"name": "f", "arguments": {}}], started=10.0, ended=10.5),
        Turn("tool", "42", (1, 3), name="f", arguments={"x": 1}, status="ok", started=10.5, ended=10.75),
        Turn("assistant", "done", (3, 4), started=10.75, ended=11.0),
    ]
    return Rollouts(
        prompt_ids=[[1, 2]] * groups,
        completion_ids=torch.arange(N * 4).view(N, 4),
        completion_mask=torch.ones(N, 4),
        logprobs=torch.tensor([[-1.0, 0.0, 0.0, -2.0]] * N),
        finish_reasons=["stop"] * N,
        num_generations=G,
        loss_mask=torch.tensor([[1.0, 0.0, 0.0, 1.0]] * N),
        conversations=[Conversation([{"role": "assistant", "content": "x"}], list(turns), "answered", 1)] * N,
    )


@pytest.mark.parametrize(
    "loss_type, expected",
    # one sequence, advantage 1, on-policy (ratio 1): each model token's surrogate term is -1.
    # grpo, bnpo, dapo: -(1 + 1) / 2 model tokens = -1 (the two tool tokens are not counted);
    # dr_grpo: -(1 + 1) / (1 sequence x max_completion_length 4) = -0.5 (the tool tokens add nothing to the sum)
    [("grpo", -1.0), ("bnpo", -1.0), ("dapo", -1.0), ("dr_grpo", -0.5)],
)
def test_tool_tokens_get_no_loss_and_no_kl(loss_type, expected):
    rollouts = multi_turn_rollouts(groups=1, G=1)
    cfg = GRPOConfig(loss_type=loss_type, beta=0.1, max_completion_length=4, num_generations=2)
    loss_mask = update_inputs(update_inputs_spec(cfg, False, False), rollouts, torch.device("cpu")).loss_mask
    assert loss_mask.tolist() == [[1.0, 0.0, 0.0, 1.0]]
    logprobs = torch.tensor([[-1.0, -3.0, -5.0, -2.0]], requires_grad=True)
    # the reference agrees on the model's tokens (k3 = 0 there) and is far off on the tool's: no KL may come from them
    ref = torch.tensor([[-1.0, 4.0, -20.0, -2.0]])
    loss, metrics = policy_loss(
        logprobs,
        None,
        torch.tensor([1.0]),
        loss_mask,
        cfg.loss_spec(),
        ref_logprobs=ref,
        num_items_in_batch=loss_mask.sum(),
    )
    assert loss.item() == pytest.approx(expected)
    assert metrics["kl"] == pytest.approx(0.0)
    loss.backward()
    assert logprobs.grad[0, 1:3].tolist() == [0.0, 0.0]  # no gradient through the tool's tokens
    assert logprobs.grad[0, 0] != 0 and logprobs.grad[0, 3] != 0


def test_mask_truncated_completions_still_applies_to_multi_turn():
    rollouts = multi_turn_rollouts()
    rollouts.finish_reasons = ["length", "stop", "stop", "stop"]
    cfg = GRPOConfig(mask_truncated_completions=True, num_generations=2)
    loss_mask = update_inputs(update_inputs_spec(cfg, False, False), rollouts, torch.device("cpu")).loss_mask
    assert loss_mask.sum(1).tolist() == [0.0, 2.0, 2.0, 2.0]
    assert rollouts.sampled_lengths.tolist() == [2, 2, 2, 2] and rollouts.completion_lengths.tolist() == [4] * 4


def test_split_concat_and_checkpoint_keep_the_turns():
    rollouts = multi_turn_rollouts()
    parts = split_rollouts(rollouts, 2)
    assert [p.loss_mask.shape for p in parts] == [(2, 4), (2, 4)] and len(parts[1].conversations) == 2
    joined = concat_rollouts(parts, pad_token_id=0)
    assert torch.equal(joined.loss_mask, rollouts.loss_mask) and joined.conversations == rollouts.conversations
    # async mode's pending rollouts go into states.pt as dataclasses.asdict, loaded with weights_only=True
    restored = Rollouts.from_dict(dataclasses.asdict(rollouts))
    assert restored.conversations == rollouts.conversations and torch.equal(restored.loss_mask, rollouts.loss_mask)
    with pytest.raises(ValueError, match="multi-turn"):
        single = dataclasses.replace(parts[0], loss_mask=None, conversations=None)
        concat_rollouts([single, parts[1]], pad_token_id=0)


def test_agent_section_of_the_config():
    cfg = GRPOConfig(agent={"tools": ["my_tools:multiply"], "max_tool_calling_iterations": 3})
    assert cfg.tools == ["my_tools:multiply"] and cfg.max_tool_calling_iterations == 3 and cfg.tool_parser == "auto"
    assert GRPOConfig(max_tool_calling_iterations=2).max_tool_calling_iterations == 2  # TRL's key, same meaning
    with pytest.raises(ConfigError, match="tools contains"):
        GRPOConfig(tools=["multiply"])
    with pytest.raises(ConfigError, match=r"generation\.engine: hf"):
        GRPOConfig(tools=["my_tools:multiply"], engine="vllm")
    with pytest.raises(ConfigError, match="tool_isolation"):
        GRPOConfig(tool_isolation="container")
    with pytest.raises(ConfigError, match="max_tool_calling_iterations"):
        GRPOConfig(max_tool_calling_iterations=-1)


def record(conversation=None, completion_index: int = 0) -> RolloutRecord:
    return RolloutRecord(
        0, completion_index, "p", "c", 1, 4, "stop", {"r": 1.0}, 1.0, 0.0, 0, conversation=conversation
    )


def test_the_store_keeps_turns_and_opens_stores_written_before(tmp_path):
    conversation = conversation_record(multi_turn_rollouts().conversations[0])
    assert conversation["turns"][1] == {
        "role": "tool",
        "text": "42",
        "name": "f",
        "arguments": {"x": 1},
        "status": "ok",
        "tokens": [1, 3],
        "start": 0.5,  # seconds after the first turn began
        "duration": 0.25,
    }
    with RolloutStore(tmp_path / "new") as store:
        store.write_step(1, [record(conversation), record(completion_index=1)], {})
        first, second = store.rollouts()
    assert first["conversation"] == conversation and second["conversation"] is None

    old = tmp_path / "old" / "rollouts.sqlite"  # a store of a grpokit without the conversation column
    with RolloutStore(old) as store:
        store.write_step(1, [record()], {})
    conn = sqlite3.connect(old)
    conn.execute("ALTER TABLE rollouts DROP COLUMN conversation")
    conn.commit()
    conn.close()
    with RolloutStore(old, readonly=True) as store:  # read as it is
        assert store.rollouts()[0]["conversation"] is None
    with RolloutStore(old) as store:  # opened for writing: the column is added
        store.write_step(2, [record(conversation)], {})
        assert [r["conversation"] for r in store.rollouts()] == [None, conversation]


class Live:
    """Stands for an environment instance: it cannot be pickled, so it must never go to a worker process."""

    def __reduce__(self):
        raise TypeError("cannot pickle a live environment")


def uses_environments(environments, completions, **kwargs):
    return [float(isinstance(e, Live)) for e in environments]


def any_kwargs(completions, **kwargs):
    return [float("environments" in kwargs)] * len(completions)


def test_environments_stay_in_this_process():
    """A reward naming `environments` runs here and gets the instances; one in a worker process never sees them."""
    with RewardRunner([uses_environments, any_kwargs], isolate=True) as runner:
        assert runner.pool.processes[0] is None and runner.pool.processes[1] is not None
        result = runner.score(["p", "p"], ["a", "b"], {"environments": [Live(), Live()]}, group_size=2)
    assert result.per_func.tolist() == [[1.0, 0.0], [1.0, 0.0]]
