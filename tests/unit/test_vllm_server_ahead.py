"""max_staleness K >= 1 with vllm_mode: server against the fake ``vllm serve`` (tests/unit/fake_vllm_server.py): the
producer's thread drives the server through :class:`ServerAheadSampler`, fixed at admission. Checked here: each
version pushed once, with the weights copied when its first batch was admitted, before every batch that needs it;
no push while anything else runs on the server (one owner of its weights); a resume that pushes the checkpoint's
weights before its first new batch; the sync check read from the sampler's gap. The real server:
tests/real_vllm/test_server_async_vllm.py."""

from __future__ import annotations

import copy
import os
import re
from types import SimpleNamespace

import pytest
import torch
from fake_vllm_server import FakeVLLM
from shared_helpers import sampling_params
from test_vllm_server_client import engine_for

from grpokit.rewards.contract import RewardState
from grpokit.rollout.vllm.weights import SyncGapError
from grpokit.system.processes import SingleProcess
from grpokit.train.experience.server_ahead import GAP_METRIC, ServerAheadSampler
from grpokit.train.experience.sources import AheadRollouts, Situation, pick_sampler

K, STEPS, PER_STEP, SEED = 2, 5, 2, 7


@pytest.fixture()
def policy(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)


def norm_sum(version: int) -> float:
    """The tiny model's final norm starts at ones (hidden size 32); each test update adds 1 to it."""
    return 32.0 * (1 + version)


def update(policy, engine) -> None:
    with torch.no_grad():
        policy.model.norm.weight.add_(1.0)
    engine.sync_weights()


def ahead_source(fake, policy, steps: int = STEPS):
    engine = engine_for(fake, policy)
    sampler = ServerAheadSampler(
        own_model=copy.deepcopy(policy),
        engine=engine,
        prompts=SimpleNamespace(ids=[[5 + i] for i in range(2 * PER_STEP * steps)]),
        procs=SingleProcess(),
        model=policy,
        num_generations=2,
        params=sampling_params(3),
        seed=SEED,
    )
    return engine, sampler, AheadRollouts(sampler, last_step=steps, max_staleness=K, score_ahead=True)


def drawer(start: int = 0):
    """The prompt source: consecutive indices, PER_STEP a batch, from ``start``."""
    drawn = iter(range(start, 1000))
    return lambda: [next(drawn) for _ in range(PER_STEP)]


def score(step, indices, rollouts, trainer_state=None):
    return step, list(indices), rollouts.policy_version, rollouts.completion_ids.tolist()


def reward_state(step):
    return RewardState(global_step=step - 1, max_steps=STEPS, epoch=0.0)


class Clock:
    def lap(self, name):
        pass


def versions_at_each_sampling(fake, sampler, steps) -> list[tuple[int, int]]:
    """(the version the server held, the version of the batch) for each /v1/completions request, in arrival order:
    the held version is the last pushed folder's (named grpokit-weights-p{pid}-v{N}-...)."""
    batch_version = {}
    for step, version in steps.items():
        for seed in sampler.seeds(step, PER_STEP, 0):
            batch_version[seed] = version
    held, found = None, []
    for route, body in fake.calls:
        if route == "/collective_rpc":
            held = int(re.search(r"-v(\d+)-", os.path.basename(body["kwargs"]["weights_path"]))[1])
        elif route == "/v1/completions":
            found.append((held, batch_version[body["seed"]]))
    return found


def test_each_version_is_pushed_once_with_its_admission_weights_before_its_batches(policy):
    with FakeVLLM() as fake:
        fake.push_dwell_s = 0.05  # a push that takes time: a sampling or push beside it would be seen
        engine, sampler, source = ahead_source(fake, policy)
        trained, draw = [], drawer()
        for step in range(1, STEPS + 1):
            trained.append(source.next_scored(step, draw, score, reward_state, Clock()))
            update(policy, engine)
        metrics = source.metrics()
        source.close()
    # step s trains version s - 1 on a batch admitted K steps before: version max(0, s - 1 - K)
    versions = {step: max(0, step - 1 - K) for step in range(1, STEPS + 1)}
    assert [t[2] for t in trained] == [versions[s] for s in range(1, STEPS + 1)] == [0, 0, 0, 1, 2]
    assert engine.pushed == [0, 1, 2]  # each version once, in admission order
    # the weights pushed are those copied at admission, not the learner's at the time of the push (by then 1-2
    # updates further)
    assert fake.pushed_norms == [norm_sum(0), norm_sum(1), norm_sum(2)]
    pairs = versions_at_each_sampling(fake, sampler, versions)
    assert len(pairs) == STEPS * PER_STEP and all(held == wanted for held, wanted in pairs), pairs
    assert fake.overlaps == []
    assert metrics["vllm_server_pushes"] == 3.0
    # the fake samples with no model (log-prob -0.5 everywhere): the copy's log-probs differ, the check sees it
    assert metrics[GAP_METRIC] > 0.1


def test_a_sampling_on_the_learners_thread_waits_for_the_producers_push(policy):
    """Evaluation samples on the learner's thread after the queue settles; even unsettled, the engine's lock keeps a
    push of the learner's version from landing beside the producer's batches, and each batch sees its version."""
    with FakeVLLM() as fake:
        fake.push_dwell_s = 0.05
        engine, _, source = ahead_source(fake, policy)
        draw = drawer()
        for step in range(1, STEPS + 1):
            source.next_scored(step, draw, score, reward_state, Clock())
            update(policy, engine)
            engine.generate([[9]], 2, sampling_params(3), seeds=[10_000 + step])  # not settled first
        source.close()
    assert fake.overlaps == []
    held, seen = None, []
    for route, body in fake.calls:  # every learner-side sampling ran on the learner's version, pushed for it
        if route == "/collective_rpc":
            held = int(re.search(r"-v(\d+)-", os.path.basename(body["kwargs"]["weights_path"]))[1])
        elif route == "/v1/completions" and 10_000 < body["seed"] <= 10_000 + STEPS:
            seen.append((body["seed"] - 10_000, held))
    assert seen == [(step, step) for step in range(1, STEPS + 1)]


def straight_and_resumed(policy, build_source, score=score):
    """``build_source(fake, policy) -> (engine, sampler, source)``'s batches over STEPS steps, and again resumed from
    its checkpoint after step 2: (the straight run's, the resumed run's from step 3, the resumed run's engine and
    fake server)."""
    straight_policy, resumed_policy = copy.deepcopy(policy), copy.deepcopy(policy)
    with FakeVLLM() as fake:
        engine, _, source = build_source(fake, straight_policy)
        straight, draw = [], drawer()
        for step in range(1, STEPS + 1):
            straight.append(source.next_scored(step, draw, score, reward_state, Clock()))
            update(straight_policy, engine)
            if step == 2:
                _, checkpoint = source.state_dict()  # after step 2: steps 3 and 4 admitted, sampled, held
        source.close()
    for _ in range(2):
        update(resumed_policy, SimpleNamespace(sync_weights=lambda: None))  # the checkpoint's weights: version 2
    with FakeVLLM() as fake:
        engine, _, source = build_source(fake, resumed_policy)
        engine.policy_version = 2  # as the rollout scheduler restores it
        source.load_state_dict(None, checkpoint)
        draw = drawer(4 * PER_STEP)  # the prompt source's position is the checkpoint's: after step 4's batch
        resumed = []
        for step in range(3, STEPS + 1):
            resumed.append(source.next_scored(step, draw, score, reward_state, Clock()))
            update(resumed_policy, engine)
        source.close()
    return straight, resumed, engine, fake


def test_a_resume_pushes_the_checkpoints_weights_before_its_first_new_batch(policy):
    straight, resumed, engine, fake = straight_and_resumed(policy, ahead_source)
    assert resumed == straight[2:]  # steps 3 and 4 from the checkpoint, step 5 sampled again the same
    assert engine.pushed == [2] and fake.pushed_norms == [norm_sum(2)]  # the checkpoint's weights, first


def test_the_sync_check_reads_the_samplers_gap_when_sampling_ahead(policy):
    with FakeVLLM() as fake:
        engine, _, source = ahead_source(fake, policy)
        assert engine.gap.metric == GAP_METRIC
        source.close()
    engine.sync_gap_stop(3, {"sampling_is/logprob_abs_diff": 5.0, GAP_METRIC: 5e-5})  # staleness, not the sync
    with pytest.raises(SyncGapError, match=rf"step 4: vLLM server {fake.url} .* by 0.0002 per token \({GAP_METRIC}\)"):
        engine.sync_gap_stop(4, {GAP_METRIC: 2e-4})
    assert GAP_METRIC in engine.sync_gap_warning(4, {GAP_METRIC: 2e-4})


def test_a_server_engine_sampling_ahead_gets_the_server_sampler():
    assert pick_sampler(Situation(tool_rollouts=False, ahead=True, server=True)).cls is ServerAheadSampler
    assert pick_sampler(Situation(tool_rollouts=False, ahead=True)).cls.__name__ == "ThreadSampler"
    assert pick_sampler(Situation(tool_rollouts=False, server=True)).cls.__name__ == "EngineSampler"  # synchronous
