"""Partial rollouts in vLLM Ray workers under max_staleness (grpokit/rollout/partial.py), without vLLM or Ray:
the switch rule worked by hand, the pieces a batch is cut into and joined from, the token staleness, and the
settings refused with one line. The real run (vLLM's CPU build, Ray) is tests/real_vllm/test_async_vllm_kills.py."""

from __future__ import annotations

import pytest
import torch
from shared_helpers import sampling_params

from grpokit.config import ConfigError, GRPOConfig
from grpokit.distributed.ray_partial_tails import PartialTails
from grpokit.rollout.partial import (
    PartialRolloutTimeout,
    continuation_seed,
    continuations,
    continue_chunk,
    head_params,
    merge,
    switch_version,
    tail_params,
)
from grpokit.rollout.seeding import concat_rollouts
from grpokit.rollout.types import Rollouts
from grpokit.train.metrics import token_staleness_sums

PAD = 0


def admitted_version(step: int, K: int) -> int:
    """The version step ``step``'s batch is admitted with (docs/async.md, 'The bound')."""
    return max(0, step - 1 - K)


def test_switch_rule_by_hand_for_k_2_and_k_1():
    # K = 2: batches 1-3 admitted with version 0, batch 4 with 1, 5 with 2, 6 with 3.
    # Tokens from S on: batch 1 none (version 1 comes from training on batch 1), then min(v + 1, b - 1):
    # b=2: min(1, 1) = 1; b=3: min(1, 2) = 1; b=4: min(2, 3) = 2; b=5: 3; b=6: 4.
    assert [switch_version(b, admitted_version(b, 2)) for b in range(1, 7)] == [None, 1, 1, 2, 3, 4]
    # K = 1: batches 1-2 with version 0, then b - 2: b=2: min(1, 1) = 1; b=3 (v 1): min(2, 2) = 2; b=4: 3.
    assert [switch_version(b, admitted_version(b, 1)) for b in range(1, 5)] == [None, 1, 2, 3]
    # K = 0 (synchronous): every batch is sampled by the newest version, b - 1: nothing to switch to
    assert [switch_version(b, admitted_version(b, 0)) for b in range(1, 5)] == [None] * 4


@pytest.mark.parametrize("K", [1, 2, 4])
def test_a_batch_never_waits_for_a_version_its_step_or_a_checkpoint_before_it_cannot_have(K):
    for b in range(1, 30):
        w = switch_version(b, admitted_version(b, K))
        if w is None:
            continue
        assert admitted_version(b, K) < w <= b - 1  # newer than admitted; exists before step b trains
        # a checkpoint after step c waits for every batch admitted by then (b <= c + K): their w is <= c
        assert all(w <= c for c in range(max(1, b - K), b))


def test_head_and_tail_sampling_split_the_length_and_min_new_tokens():
    params = sampling_params(8, min_new_tokens=5)
    head, tail = head_params(params, 3), tail_params(params, 3)
    assert (head.max_completion_length, head.min_new_tokens) == (3, 3)  # 5 held back: 3 fit in the head
    assert (tail.max_completion_length, tail.min_new_tokens) == (5, 2)  # 8 - 3 tokens left, 5 - 3 still held back
    assert tail_params(sampling_params(8, min_new_tokens=1), 3).min_new_tokens == 0


def rollouts(prompts, rows, reasons, G, version, logprob_of=lambda r, t: -(r + 1) / 10 - t / 100) -> Rollouts:
    """Rollouts whose row r holds ``rows[r]`` (tokens), log-prob -(r + 1)/10 - t/100 for token t."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), PAD)
    mask = torch.zeros(len(rows), width)
    logprobs = torch.zeros(len(rows), width)
    for r, tokens in enumerate(rows):
        ids[r, : len(tokens)] = torch.tensor(tokens)
        mask[r, : len(tokens)] = 1.0
        logprobs[r, : len(tokens)] = torch.tensor([logprob_of(r, t) for t in range(len(tokens))])
    return Rollouts(prompts, ids, mask, logprobs, reasons, G, policy_version=version)


HEAD_ROWS = [[5, 6, 7], [5, 9], [6, 6, 9], [7, 7, 7]]


def test_continuations_are_the_samples_stopped_at_s_tokens_with_their_own_seeds():
    # 2 prompts x G 2, S = 3: row 0 hit the limit; row 1 stopped at EOS (9) early; row 2 stopped at EOS as its
    # third token (finish stop: done); row 3 hit the limit
    head = rollouts([[1, 2], [3]], HEAD_ROWS, ["length", "stop", "stop", "length"], 2, 4)
    rows, prompts, seeds = continuations(head, [100, 200], 3, greedy=False)
    assert rows == [0, 3]
    assert prompts == [[1, 2, 5, 6, 7], [3, 7, 7, 7]]
    # sample i of a group was sampled with the group's seed + i (vLLM's children): row 0 = 100 + 0, row 3 = 200 + 1
    assert seeds == [continuation_seed(100), continuation_seed(201)]
    assert continuation_seed(100) == (100 * 1_000_003 + 1) % (2**63 - 1) == 100_000_301
    assert continuations(head, [100, 200], 3, greedy=True)[2] == [continuation_seed(100), continuation_seed(200)]


def test_merge_appends_each_continuation_with_its_version_and_its_own_logprobs():
    head = rollouts([[1, 2], [3]], HEAD_ROWS, ["length", "stop", "stop", "length"], 2, 4)
    # the continuations of rows 0 and 3 (by version 5): 2 tokens ending with EOS, and 4 tokens cut at the length
    tail = rollouts(
        [[1, 2, 5, 6, 7], [3, 7, 7, 7]], [[8, 9], [8, 8, 8, 8]], ["stop", "length"], 1, 5, lambda r, t: -1.0 - r
    )
    merged = merge(head, [0, 3], tail, 5, PAD)
    assert merged.completion_ids.tolist() == [
        [5, 6, 7, 8, 9, PAD, PAD],
        [5, 9, PAD, PAD, PAD, PAD, PAD],
        [6, 6, 9, PAD, PAD, PAD, PAD],
        [7, 7, 7, 8, 8, 8, 8],
    ]
    assert merged.completion_lengths.tolist() == [5, 2, 3, 7]
    assert merged.finish_reasons == ["stop", "stop", "stop", "length"]
    assert merged.token_versions.tolist() == [
        [4, 4, 4, 5, 5, 0, 0],  # 0 on padding
        [4, 4, 0, 0, 0, 0, 0],
        [4, 4, 4, 0, 0, 0, 0],
        [4, 4, 4, 5, 5, 5, 5],
    ]
    assert merged.policy_version == 4  # the oldest: policy_staleness counts from it
    # each token keeps the log-prob of the policy that sampled it: head's -(r+1)/10 - t/100, the tail's -1 - k
    expected_row0 = [-0.1, -0.11, -0.12, -1.0, -1.0]
    expected_row3 = [-0.4, -0.41, -0.42, -2.0, -2.0, -2.0, -2.0]
    torch.testing.assert_close(merged.logprobs[0, :5], torch.tensor(expected_row0))
    torch.testing.assert_close(merged.logprobs[3], torch.tensor(expected_row3))
    assert merge(head, [], None, 5, PAD) is head  # nothing continued: the head as it is (token_versions None)


def test_a_worker_continues_only_the_samples_still_going_and_returns_their_gap():
    head = rollouts([[1, 2], [3]], HEAD_ROWS, ["length", "stop", "stop", "length"], 2, 4)
    asked = []

    def sample(prompts, seeds):  # the worker's vLLM by version 5: one token (EOS) each, gap 3e-7
        asked.append((prompts, seeds))
        return rollouts(prompts, [[9]] * len(prompts), ["stop"] * len(prompts), 1, 5), 3e-7

    tail = sampling_params(5)
    merged, gap = continue_chunk(head, [100, 200], 3, tail, 5, PAD, sample)
    assert asked == [([[1, 2, 5, 6, 7], [3, 7, 7, 7]], [continuation_seed(100), continuation_seed(201)])]
    assert merged.completion_lengths.tolist() == [4, 2, 3, 4] and gap == 3e-7
    done = rollouts([[1]], [[5, 9], [9]], ["stop", "stop"], 2, 4)  # every sample ended before S: nothing sampled
    assert continue_chunk(done, [100], 3, tail, 5, PAD, sample) == (done, None) and len(asked) == 1


def test_joined_chunks_keep_their_token_versions():
    a = rollouts([[1]], [[5, 6], [5]], ["stop", "stop"], 2, 3)  # one sampled by version 3 only
    b = rollouts([[2]], [[7, 7, 7], [8]], ["stop", "stop"], 2, 3)
    b.token_versions = torch.tensor([[3, 4, 4], [3, 0, 0]])
    joined = concat_rollouts([a, b], PAD)
    assert joined.token_versions.tolist() == [[3, 3, 0], [3, 0, 0], [3, 4, 4], [3, 0, 0]]
    assert concat_rollouts([a, a], PAD).token_versions is None


def test_token_staleness_by_hand():
    # trained at version 6, batch admitted with 4 (staleness 2); row 0: 3 tokens by 4 and 2 by 5; row 1: 2 by 4
    r = rollouts([[1]], [[5, 6, 7, 8, 9], [5, 9]], ["stop", "stop"], 2, 4)
    r.token_versions = torch.tensor([[4, 4, 4, 5, 5], [4, 4, 0, 0, 0]])
    # token staleness: 2, 2, 2, 1, 1 and 2, 2 -> sum 12 over 7 tokens
    assert token_staleness_sums(r, 2).tolist() == [12.0, 7.0]
    r.token_versions = None  # every token by version 4: 7 tokens of staleness 2
    assert token_staleness_sums(r, 2).tolist() == [14.0, 7.0]


RAY_VLLM = dict(engine="vllm", backend="ray", max_staleness=2, max_completion_length=8)


def test_partial_rollouts_with_vllm_ray_workers_ahead_are_a_valid_config():
    args = GRPOConfig(**RAY_VLLM, vllm_partial_rollout_tokens=4)
    assert args.vllm_partial_rollout_tokens == 4 and args.vllm_partial_rollout_timeout == 1800.0
    assert GRPOConfig(**RAY_VLLM).vllm_partial_rollout_tokens is None  # off by default


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (dict(engine="hf"), r"not with generation.engine: hf, distributed.backend: ray.* with backend: ray"),
        (dict(backend="none", max_staleness=0), r"not with generation.engine: vllm, distributed.backend: none"),
        (dict(vllm_mode="server"), r"vllm_mode: server samples from the server, driven by the learner, so backend"),
        (dict(max_staleness=0), r"max_staleness: 0 .* \(nothing to switch to\); set max_staleness >= 1"),
        (dict(vllm_partial_rollout_tokens=8), r"vllm_partial_rollout_tokens=8 must be in \[1, max_completion_length=8"),
        (dict(vllm_partial_rollout_tokens=0), r"vllm_partial_rollout_tokens=0 must be in \[1,"),
        (dict(vllm_partial_rollout_timeout=0), r"vllm_partial_rollout_timeout=0(\.0)? must be > 0"),
    ],
)
def test_partial_rollouts_are_refused_where_they_cannot_run_in_one_line(overrides, message):
    with pytest.raises(ConfigError, match=message) as caught:
        GRPOConfig(**{**RAY_VLLM, "vllm_partial_rollout_tokens": 4, **overrides})
    assert "\n" not in str(caught.value)


def test_partial_rollouts_are_refused_under_torchrun():
    args = GRPOConfig(**RAY_VLLM, vllm_partial_rollout_tokens=4)
    args.validate(world_size=1)
    with pytest.raises(ConfigError, match=r"runs with one learner process; under torchrun \(2 processes\)"):
        args.validate(world_size=2)


class Batch:
    """A PendingRollouts' fields the waiting list reads."""

    def __init__(self, name: str, switch: int) -> None:
        self.name, self.switch, self.tails = name, switch, None


def test_continuations_are_launched_when_their_version_is_published_in_admission_order():
    tails = PartialTails(tokens=4, timeout=60.0)
    launched = []

    def launch(batch):
        launched.append(batch.name)
        return {f"ref-{batch.name}": (0, 0)}

    b2, b3, b4 = Batch("b2", 1), Batch("b3", 1), Batch("b4", 2)  # K = 2: batches 2 and 3 by 1, batch 4 by 2
    for batch in (b2, b3, b4):
        tails.admit(batch)
    tails.published(0, ["w0"], launch)
    assert launched == []  # nobody waits for version 0
    tails.published(1, ["w1"], launch)
    assert launched == ["b2", "b3"] and b2.tails == {"ref-b2": (0, 0)} and b4.tails is None
    tails.wait(b2)  # launched: returns at once
    tails.done(b2)  # collected: versions before 1 are no longer needed
    assert sorted(tails.weights) == [1]
    tails.published(2, ["w2"], launch)
    assert launched == ["b2", "b3", "b4"]
    tails.done(b4)
    assert sorted(tails.weights) == [2]


def test_a_wait_for_a_version_never_published_ends_in_one_line_or_on_interrupt():
    tails = PartialTails(tokens=4, timeout=0.01)  # nothing publishes version 5: the wait always times out
    batch = Batch("b", 5)
    tails.admit(batch)
    with pytest.raises(PartialRolloutTimeout, match=r"waited 0.01 s for policy version 5 .* raise generation.vllm_"):
        tails.wait(batch)
    tails.interrupt()
    with pytest.raises(RuntimeError, match="stopped waiting for policy version 5: the run is ending"):
        tails.wait(batch)
