"""Partial rollouts from a vLLM server sampling ahead (grpokit/train/experience/server_partial.py) against the fake
``vllm serve`` (tests/unit/fake_vllm_server.py, whose completions are min(max_tokens, 3) tokens, each a function of
the request's seed, all ending at the length limit). K = 2, S = 2 of max_completion_length 5: a batch's heads are 2
tokens by its admitted version v, its continuations 3 tokens by w = min(v + 1, b - 1), each n = 1 with its own seed,
its prompt the prompt and the head's tokens. Checked here: those requests, each on the version it needs (the push
order at the start included), the wait for w's copy and its timeout, the copies dropped, and an exact resume.
The real server: tests/real_vllm/test_server_vllm.py (K = 2 with S = 4)."""

from __future__ import annotations

import copy
import os
import re
import threading
from types import SimpleNamespace

import pytest
import torch
from fake_vllm_server import FakeVLLM
from shared_helpers import sampling_params
from test_vllm_server_ahead import Clock, drawer, norm_sum, reward_state, straight_and_resumed, update
from test_vllm_server_client import engine_for

from grpokit.config import ConfigError, GRPOConfig
from grpokit.rollout.partial import PartialRolloutTimeout, continuation_seed
from grpokit.system.processes import SingleProcess
from grpokit.train.experience.server_ahead import CONTINUED_GAP_METRIC, GAP_METRIC, ServerAheadSampler
from grpokit.train.experience.server_partial import VersionCopies
from grpokit.train.experience.sources import AheadRollouts

K, STEPS, PER_STEP, SEED, G, S, LENGTH = 2, 5, 2, 7, 2, 2, 5
WAIT_S = 60.0  # a bound on how long a thread of this test may take on a busy machine; never reached when it works
# step b's batch: admitted with v = max(0, b - 1 - K), continued by w = min(v + 1, b - 1) (none for batch 1)
ADMITTED = {1: 0, 2: 0, 3: 0, 4: 1, 5: 2}
SWITCH = {1: None, 2: 1, 3: 1, 4: 2, 5: 3}


@pytest.fixture()
def policy(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)


def partial_sampler(fake, policy, timeout: float = WAIT_S):
    engine = engine_for(fake, policy)
    sampler = ServerAheadSampler(
        own_model=copy.deepcopy(policy),
        partial_rollouts=(S, timeout),
        engine=engine,
        prompts=SimpleNamespace(ids=[[5 + i] for i in range(2 * PER_STEP * STEPS)]),
        procs=SingleProcess(),
        model=policy,
        num_generations=G,
        params=sampling_params(LENGTH),
        seed=SEED,
    )
    return engine, sampler


def partial_source(fake, policy):
    engine, sampler = partial_sampler(fake, policy)
    return engine, sampler, AheadRollouts(sampler, last_step=STEPS, max_staleness=K, score_ahead=True)


def score(step, indices, rollouts, trainer_state=None):
    versions = None if rollouts.token_versions is None else rollouts.token_versions.tolist()
    return (step, list(indices), rollouts.policy_version, rollouts.completion_ids.tolist(), versions,
            rollouts.logprobs.tolist(), list(rollouts.finish_reasons))  # fmt: skip


def requests(fake) -> list[tuple[int | None, dict]]:
    """(the version the server held, the body) of each /v1/completions request, in arrival order."""
    held, found = None, []
    for route, body in fake.calls:
        if route == "/collective_rpc":
            held = int(re.search(r"-v(\d+)-", os.path.basename(body["kwargs"]["weights_path"]))[1])
        elif route == "/v1/completions":
            found.append((held, body))
    return found


def fake_tokens(seed: int, index: int, count: int) -> list[int]:
    """The fake server's tokens of choice ``index`` of a request seeded ``seed``."""
    return [3 + (seed + index + t) % 30 for t in range(count)]


def test_heads_sample_s_tokens_at_v_and_continuations_the_rest_at_w_with_their_seeds(policy):
    with FakeVLLM() as fake:
        fake.push_dwell_s = 0.02  # a push that takes time: a sampling beside it would be seen
        engine, sampler, source = partial_source(fake, policy)
        trained, draw, held = [], drawer(), []
        for step in range(1, STEPS + 1):
            trained.append(source.next_scored(step, draw, score, reward_state, Clock()))
            held.append((step, sampler.partial.held()))
            update(policy, engine)
        metrics = source.metrics()
        source.close()
    heads, tails = {}, {}  # by seed; continuations by (seed, prompt): consecutive groups' seeds differ by 1
    for held_version, body in requests(fake):
        if body["n"] == G:
            heads[body["seed"]] = (held_version, body)
        else:
            tails[body["seed"], tuple(body["prompt"])] = (held_version, body)
    for step, indices, version, ids, versions, _, reasons in trained:
        v, w = ADMITTED[step], SWITCH[step]
        assert version == v
        for j, (index, seed) in enumerate(zip(indices, sampler.seeds(step, PER_STEP, 0))):
            at, body = heads[seed]  # the head: G samples of at most S tokens by v, the run's group seed
            assert (at, body["max_tokens"], body["prompt"]) == (v, S if w is not None else LENGTH, [5 + index])
            for i in range(G):
                row = j * G + i
                if w is None:  # batch 1: sampled whole by version 0, 3 tokens (the fake's most)
                    assert ids[row] == fake_tokens(seed, i, 3) and versions is None
                    continue
                head = fake_tokens(seed, i, S)  # sample i of the group: the group's seed + i
                at, tail = tails[continuation_seed(seed + i), (5 + index, *head)]
                assert (at, tail["max_tokens"]) == (w, LENGTH - S)
                assert ids[row] == head + fake_tokens(continuation_seed(seed + i), 0, 3)
                assert versions[row] == [v] * S + [w] * 3 and reasons[row] == "length"
    assert len(heads) == STEPS * PER_STEP and len(tails) == (STEPS - 1) * PER_STEP * G
    # one set of weights on the server: batches 2 and 3 (admitted at 0, continued at 1) alternate it at the start
    assert engine.pushed == [0, 1, 0, 1, 2, 3] and metrics["vllm_server_pushes"] == 6.0
    assert fake.pushed_norms == [norm_sum(v) for v in engine.pushed]  # each version's own weights
    assert fake.overlaps == []
    # the fake samples with no model (log-prob -0.5 everywhere): both checks see the gap
    assert metrics[GAP_METRIC] >= metrics[CONTINUED_GAP_METRIC] > 0.1
    # a copy is held only for versions a batch not collected yet continues on: after step s, batches s+1..s+K
    for step, versions in held:
        assert set(versions) <= {SWITCH[b] for b in range(step + 1, min(step + K, STEPS) + 1)}, (step, versions)
    assert sampler.partial.held() == []


def test_the_continuations_wait_for_the_learner_to_share_the_next_version(policy):
    with FakeVLLM() as fake:
        engine, sampler = partial_sampler(fake, policy)
        waiting, real_wait = threading.Event(), sampler.partial.wait
        sampler.partial.wait = lambda version: waiting.set() or real_wait(version)
        pending = sampler.submit(2, [0, 1])  # step 2, admitted with version 0: continues on 1
        sampler.share_weights()  # version 0: nothing continues on it, nothing copied
        assert sampler.partial.held() == []
        result = {}
        thread = threading.Thread(target=lambda: result.update(r=sampler.collect(pending)))
        thread.start()
        assert waiting.wait(WAIT_S)  # the heads are sampled; the continuations wait for version 1
        assert [body["n"] for _, body in requests(fake)] == [G, G] and thread.is_alive()
        update(policy, engine)  # step 1 trained: version 1
        sampler.share_weights()
        thread.join(WAIT_S)
        assert not thread.is_alive()
        sampler.close()
    assert [body["n"] for _, body in requests(fake)] == [G, G] + [1] * (2 * G)
    assert result["r"].token_versions[:, S:].unique().tolist() == [1] and engine.pushed == [0, 1]
    assert fake.pushed_norms == [norm_sum(0), norm_sum(1)]
    assert sampler.partial.held() == []  # the one batch that needed version 1 is collected


def test_a_continuation_whose_version_never_comes_ends_in_one_line_or_on_interrupt(policy):
    with FakeVLLM() as fake:
        _, sampler = partial_sampler(fake, policy, timeout=0.01)  # nothing shares version 1: the wait times out
        with pytest.raises(PartialRolloutTimeout) as caught:
            sampler.collect(sampler.submit(2, [0, 1]))
        sampler.interrupt()
        with pytest.raises(RuntimeError, match="stopped waiting for policy version 1: the run is ending"):
            sampler.collect(sampler.submit(3, [2, 3]))
        sampler.close()
    text = str(caught.value)
    assert "\n" not in text and "waited 0.01 s for policy version 1" in text
    assert "raise generation.vllm_partial_rollout_timeout" in text and "vllm_partial_rollout_tokens: null" in text


def test_copies_are_kept_while_a_batch_continues_on_them_then_dropped():
    copies = VersionCopies(tokens=S, timeout=WAIT_S)
    for version in (1, 1, 2):  # K = 2: batches 2 and 3 continue on 1, batch 4 on 2
        copies.admit(version)
    assert not copies.needs(0) and copies.needs(1) and copies.needs(2)
    copies.share(1, {"w": 1})
    assert not copies.needs(1) and copies.held() == [1] and copies.wait(1) == {"w": 1}
    copies.done(1)  # batch 2 collected: batch 3 still needs version 1
    assert copies.held() == [1]
    copies.done(1)
    assert copies.held() == []
    copies.share(2, {"w": 2})
    copies.done(2)
    assert copies.held() == [] and not copies.needs(2)


def test_a_resume_with_partial_rollouts_equals_the_uninterrupted_run(policy):
    straight, resumed, engine, fake = straight_and_resumed(policy, partial_source, score)
    assert resumed == straight[2:]  # token versions included
    # step 5's batch: admitted at step 3 with version 2, continued on 3 (the weights after resumed step 3)
    assert engine.pushed == [2, 3] and fake.pushed_norms == [norm_sum(2), norm_sum(3)]


SERVER = dict(engine="vllm", vllm_mode="server", max_staleness=2, max_completion_length=8)


def test_partial_rollouts_from_a_server_sampling_ahead_are_a_valid_config():
    args = GRPOConfig(**SERVER, vllm_partial_rollout_tokens=4)
    assert (args.vllm_mode, args.vllm_partial_rollout_tokens) == ("server", 4)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (dict(max_staleness=0), r"max_staleness: 0 .* \(nothing to switch to\)"),
        (dict(vllm_partial_rollout_tokens=8), r"vllm_partial_rollout_tokens=8 must be in \[1, max_completion_length"),
        (dict(vllm_mode="colocate"), r"vllm_mode: colocate; set engine: vllm with backend: ray and vllm_mode: coloc"),
    ],
)
def test_partial_rollouts_from_a_server_are_refused_where_they_cannot_run_in_one_line(overrides, message):
    with pytest.raises(ConfigError, match=message) as caught:
        GRPOConfig(**{**SERVER, "vllm_partial_rollout_tokens": 4, **overrides})
    assert "\n" not in str(caught.value)
