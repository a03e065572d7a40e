"""The bounded-staleness and off-policy-correction keys: resolved values and one-line refusals."""

from __future__ import annotations

import pytest

from grpokit.config import ConfigError, GRPOConfig


def test_max_staleness_resolves_from_async_rollouts():
    assert GRPOConfig().distributed.staleness_bound() == 0
    assert GRPOConfig(backend="ray", async_rollouts=True).distributed.staleness_bound() == 1
    assert GRPOConfig(max_staleness=4).distributed.staleness_bound() == 4


def test_decoupled_ppo_shapes_the_loss_weights_only_when_sampling_ahead():
    spec = GRPOConfig(
        max_staleness=2,
        off_policy_correction="decoupled_ppo",
        off_policy_is_mode="sequence_mask",
        off_policy_is_min=0.5,
    ).loss_spec()
    assert (spec.sampling_is_mode, spec.sampling_is_min, spec.sampling_cap) == ("sequence_mask", 0.5, 3.0)
    synchronous = GRPOConfig(off_policy_correction="decoupled_ppo", off_policy_is_mode="sequence_mask").loss_spec()
    assert (synchronous.sampling_is_mode, synchronous.sampling_cap) == ("token_truncate", 3.0)  # vLLM's TIS


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_staleness": -1}, "max_staleness=-1 must be >= 0"),
        ({"backend": "ray", "async_rollouts": True, "max_staleness": 0}, "drop async_rollouts or set max_staleness"),
        ({"max_staleness": 1, "engine": "transformers"}, "set engine: hf, vllm_mode: server, backend: ray, or"),
        ({"max_staleness": 2, "engine": "vllm"}, "not generation.engine: vllm in this process"),
        ({"engine": "vllm", "vllm_mode": "server", "backend": "ray"}, "set backend: none (max_staleness >= 1"),
        ({"engine": "vllm", "vllm_mode": "server", "backend": "ray", "max_staleness": 1}, "or vllm_mode: colocate"),
        ({"max_staleness": 2, "scoring_threads": 2}, "set reward_isolation: false"),
        ({"scoring_threads": 0}, "scoring_threads=0 must be >= 1"),
        ({"off_policy_correction": "areal"}, "choose one of behaviour, decoupled_ppo"),
        ({"off_policy_is_min": 2.0, "off_policy_is_max": 1.0}, "need 0 <= min < max"),
        ({"max_staleness": 1, "dynamic_sampling": True}, "max_staleness: 0"),
    ],
)
def test_bad_settings_are_refused_with_the_fix(kwargs, message):
    with pytest.raises(ConfigError) as err:
        GRPOConfig(**kwargs)
    assert message in str(err.value)


def test_a_vllm_server_samples_ahead_without_ray():
    config = GRPOConfig(engine="vllm", vllm_mode="server", max_staleness=2, off_policy_correction="decoupled_ppo")
    assert config.distributed.staleness_bound() == 2 and config.backend == "none"


def test_scoring_threads_with_thread_run_rewards_is_accepted():
    config = GRPOConfig(max_staleness=2, scoring_threads=2, reward_isolation=False)
    assert config.scoring_threads == 2
