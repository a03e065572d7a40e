"""Partial rollouts on the real vLLM (its CPU build): new weights arrive while a batch is being generated, vLLM
pauses (its running requests preempted and kept), loads them and continues; every token carries the version that
sampled it, its stored log-prob is that policy's (float32 gap <= 1e-5 on each piece), and the store keeps the
versions."""

from __future__ import annotations

import gc

import pytest
import torch
from real_vllm_helpers import GAP_FP32, SETTINGS, TARGET_REWARD, prompts

from grpokit import GRPOConfig, GRPOTrainer
from grpokit.rollout.types import SamplingParams
from grpokit.rollout.vllm.partial import WeightUpdate, generate_partial
from grpokit.store import RolloutRecord, RolloutStore
from grpokit.store.record import completion_runs
from grpokit.store.versions import expand_runs
from grpokit.train.learning.policy_logprobs import batched_logprobs, build_batch

PROMPTS = [[5, 6, 7], [8, 9]]
SWITCH_AFTER = 4  # engine steps on the first weights: the prefill's token, then 3 decoding steps


@pytest.fixture(scope="module")
def built(tmp_path_factory, vllm_model_dir):
    args = GRPOConfig(**{**SETTINGS, "output_dir": str(tmp_path_factory.mktemp("partial") / "run"), "dtype": "float32"})
    trainer = GRPOTrainer(str(vllm_model_dir), TARGET_REWARD, args=args, train_dataset=prompts())
    yield trainer
    del trainer
    gc.collect()  # before another module builds its vLLM (conftest.one_vllm_at_a_time)


def learner_logprobs(trainer, rollouts) -> torch.Tensor:
    """[N, T] the learner's log-probs of the sampled tokens with its current weights."""
    batch = build_batch(trainer.model, rollouts, trainer.tokenizer.pad_token_id, trainer.device)
    with torch.no_grad():
        return batched_logprobs(trainer.model, batch, 1.0, 8).cpu()


def max_gap(learner: torch.Tensor, rollouts, mask: torch.Tensor) -> float:
    return float(((learner - rollouts.logprobs).abs() * mask).max())


def test_without_an_update_it_samples_what_generate_samples(built):
    params = SamplingParams.plain(8)
    whole = built.engine.generate(PROMPTS, 3, params, seeds=[11, 12])
    stepped = generate_partial(built.engine, PROMPTS, 3, params, seeds=[11, 12], updates=lambda steps: None)
    assert torch.equal(whole.completion_ids, stepped.completion_ids)
    assert torch.allclose(whole.logprobs, stepped.logprobs, atol=1e-6)
    assert stepped.token_versions is None and stepped.finish_reasons == whole.finish_reasons


def test_a_partial_rollout_carries_two_versions_each_piece_sampled_by_its_policy(built, tmp_path):
    engine, policy = built.engine, built.model
    # no min_new_tokens: vLLM's processed log-probs would then exclude EOS, which the learner's do not
    params = SamplingParams.plain(12)
    first = engine.policy_version
    old_weights = {k: v.clone() for k, v in policy.state_dict().items()}
    calls = []

    def updates(steps: int) -> WeightUpdate | None:
        calls.append(steps)
        if steps != SWITCH_AFTER:
            return None
        with torch.no_grad():  # an optimizer step's worth of change, in place, as the learner makes it
            for p in policy.parameters():
                p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(7)))
        engine.sync_weights()
        return WeightUpdate(engine.policy_version, policy)

    rollouts = generate_partial(engine, PROMPTS, 3, params, seeds=[11, 12], updates=updates)
    lengths = rollouts.completion_lengths.tolist()
    assert SWITCH_AFTER in calls and sum(n > SWITCH_AFTER for n in lengths) >= 3, lengths
    versions = rollouts.token_versions
    assert rollouts.policy_version == first and versions is not None
    for row, n in zip(versions.tolist(), lengths):  # each sample: the old version, then the new one from one token on
        assert row[:n] == [first] * min(n, SWITCH_AFTER) + [first + 1] * (n - SWITCH_AFTER)
    new_piece = (versions == first + 1).float() * rollouts.completion_mask  # [N, T]
    old_piece = (versions == first).float() * rollouts.completion_mask  # [N, T]

    # each piece's stored log-probs (the behaviour log-probs the importance weights use) are its own policy's
    after = learner_logprobs(built, rollouts)
    assert max_gap(after, rollouts, new_piece) <= GAP_FP32
    assert max_gap(after, rollouts, old_piece) > 1e-3  # not the new policy's: the old piece was not re-scored
    new_weights = {k: v.clone() for k, v in policy.state_dict().items()}
    policy.load_state_dict(old_weights)
    try:
        assert max_gap(learner_logprobs(built, rollouts), rollouts, old_piece) <= GAP_FP32
    finally:
        policy.load_state_dict(new_weights)

    # the store keeps each completion's versions; read back token by token
    records = [
        RolloutRecord(
            prompt_index=n // 3,
            completion_index=n % 3,
            prompt="p",
            completion="c",
            prompt_tokens=len(PROMPTS[n // 3]),
            completion_tokens=lengths[n],
            finish_reason=rollouts.finish_reasons[n],
            rewards={},
            reward=None,
            advantage=None,
            policy_version=rollouts.policy_version,
            token_versions=completion_runs(rollouts, n),
        )
        for n in range(6)
    ]
    with RolloutStore(tmp_path / "run") as store:
        store.write_step(1, records, {})
        read = store.rollouts(step=1)
    for n, row in enumerate(read):
        assert (
            expand_runs(row["token_versions"], lengths[n], row["policy_version"]) == versions[n, : lengths[n]].tolist()
        )

    # the next sampling uses the new weights throughout
    again = engine.generate(PROMPTS, 3, SamplingParams.plain(8), seeds=[1, 2])
    assert again.policy_version == first + 1 and again.token_versions is None
    assert max_gap(learner_logprobs(built, again), again, again.completion_mask) <= GAP_FP32
