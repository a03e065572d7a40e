"""The algorithm registry (algos/algorithms.py): names, the config's choice, and each algorithm's advantages."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from grpokit.algos.algorithms import ALGORITHMS, AdvantageInputs, get_algorithm
from grpokit.algos.estimators import compute_advantages
from grpokit.config import ConfigError, GRPOConfig


def test_names_and_the_errors_that_list_them():
    assert list(ALGORITHMS) == ["grpo", "ppo"]
    assert get_algorithm("ppo").uses_critic and not get_algorithm("grpo").uses_critic
    with pytest.raises(ValueError, match="unknown algorithm 'reinforce'; valid choices: grpo, ppo"):
        get_algorithm("reinforce")
    with pytest.raises(
        ConfigError, match=r"algorithm='pp0' is not valid; choose one of grpo, ppo\. Did you mean 'ppo'"
    ):
        GRPOConfig(algorithm="pp0")
    assert GRPOConfig().algorithm == "grpo"  # the default keeps every existing config as it was


def test_the_registry_and_the_config_import_no_torch():
    code = "import sys, grpokit.config, grpokit.algos.algorithms; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_group_size_one_is_ppo_only():
    with pytest.raises(ConfigError, match=r"GRPO needs at least 2 completions per prompt.*algorithm: ppo"):
        GRPOConfig(num_generations=1, per_device_train_batch_size=4)
    assert GRPOConfig(algorithm="ppo", num_generations=1, per_device_train_batch_size=4).num_generations == 1


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"kl_in_reward": True}, "kl_in_reward: true folds the KL into per-token rewards"),
        ({"algorithm": "ppo", "importance_sampling_level": "sequence"}, "set importance_sampling_level: token"),
        ({"algorithm": "ppo", "gamma": 1.5}, r"gamma=1.5 must be in \[0, 1\]"),
        ({"algorithm": "ppo", "lam": -0.1}, r"lam=-0.1 must be in \[0, 1\]"),
        ({"algorithm": "ppo", "vf_coef": 0.0}, "vf_coef=0.0 must be > 0"),
        ({"algorithm": "ppo", "cliprange_value": 0.0}, "cliprange_value=0.0 must be > 0"),
        ({"algorithm": "ppo", "critic_learning_rate": -1.0}, "critic_learning_rate=-1.0 must be >= 0"),
    ],
)
def test_ppo_options_are_checked(settings, message):
    with pytest.raises(ConfigError, match=message):
        GRPOConfig(**settings)


def test_ppo_runs_in_one_process():
    with pytest.raises(ConfigError, match="algorithm: ppo trains its critic in one process; this run has 2"):
        GRPOConfig(algorithm="ppo", per_device_train_batch_size=8).validate(world_size=2)


def test_trl_ppo_names_are_aliases():
    cfg = GRPOConfig(algorithm="ppo", num_ppo_epochs=4, cliprange=0.1, kl_coef=0.02)
    assert (cfg.num_iterations, cfg.epsilon, cfg.beta) == (4, 0.1, 0.02)


def test_kl_in_reward_takes_beta_out_of_the_loss():
    assert GRPOConfig(algorithm="ppo", beta=0.05).loss_spec().beta == 0.05
    assert GRPOConfig(algorithm="ppo", beta=0.05, kl_in_reward=True).loss_spec().beta == 0.0


def test_grpo_advantages_are_the_family_s_sliced_to_this_process():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0])  # two groups of G = 2
    mask = torch.ones(2, 3)
    cfg = GRPOConfig(advantage_estimator="grpo", scale_rewards="group")
    out = get_algorithm("grpo").advantages(AdvantageInputs(rewards, 2, slice(2, 4), mask, beta=0.0), cfg.algo)
    # group [0, 1]: mean 0.5, unbiased std sqrt(0.5) = 0.70711; A = -+0.5 / (0.70711 + 1e-4) = -+0.70700
    torch.testing.assert_close(out.advantages, torch.tensor([-0.70700, 0.70700]), atol=1e-5, rtol=0)
    torch.testing.assert_close(out.advantages, compute_advantages(rewards, 2)[2:4])
    assert out.per_sequence is out.advantages and out.returns is None and out.loss_mask is None
    rloo = get_algorithm("grpo").advantages(
        AdvantageInputs(rewards, 2, slice(0, 4), mask, beta=0.0), cfg.replace(advantage_estimator="rloo").algo
    )
    torch.testing.assert_close(rloo.advantages, torch.tensor([1.0, -1.0, -1.0, 1.0]))  # r_i - the other's reward


def test_ppo_advantages_by_hand():
    # row 0: reward 1 on its last token, values [0.5, 0.25]; row 1: no reward (NaN), left out of the losses
    rewards = torch.tensor([1.0, float("nan")])
    values = torch.tensor([[0.5, 0.25], [0.2, 0.3]])
    mask = torch.ones(2, 2)
    cfg = GRPOConfig(algorithm="ppo", gamma=1.0, lam=1.0, beta=0.0)
    out = get_algorithm("ppo").advantages(
        AdvantageInputs(rewards, 1, slice(0, 2), mask, beta=0.0, values=values), cfg.algo
    )
    # delta_1 = 1 + 0 - 0.25 = 0.75; delta_0 = 0 + 0.25 - 0.5 = -0.25; A_1 = 0.75, A_0 = -0.25 + 0.75 = 0.5
    # returns = A + V = [1, 1]; whitened over row 0's tokens: mean 0.625, unbiased var 2 * 0.125^2 = 0.03125,
    # (A - 0.625) / sqrt(0.03125) = [-0.70711, 0.70711]; row 1 is masked out: 0
    torch.testing.assert_close(out.advantages, torch.tensor([[-0.70711, 0.70711], [0.0, 0.0]]), atol=1e-5, rtol=0)
    torch.testing.assert_close(out.returns, torch.tensor([[1.0, 1.0], [0.0, 0.0]]))
    torch.testing.assert_close(out.loss_mask, torch.tensor([[1.0, 1.0], [0.0, 0.0]]))
    torch.testing.assert_close(out.per_sequence, torch.tensor([0.0, 0.0]), atol=1e-6, rtol=0)  # token means
    # residuals R - V = [0.5, 0.75]: var 0.03125; returns [1, 1]: var 0 -> 1 - 0.03125 / 1e-5 = -3124
    assert out.metrics["explained_variance"] == pytest.approx(-3124.0, rel=1e-4)
    assert out.metrics["value/mean"] == pytest.approx(0.375) and out.metrics["returns/mean"] == pytest.approx(1.0)
    assert "kl" not in out.metrics


def test_ppo_kl_in_reward_by_hand():
    # one row, two tokens, reward 1; k1 = old - ref = [0.5, -0.25] weighted by beta 0.1 enters the rewards:
    # r = [-0.05, 1 + 0.025] = [-0.05, 1.025]; values 0, gamma = lam = 1: returns = suffix sums = [0.975, 1.025]
    rewards = torch.tensor([1.0])
    old, ref = torch.tensor([[-1.0, -2.0]]), torch.tensor([[-1.5, -1.75]])
    inputs = AdvantageInputs(
        rewards,
        1,
        slice(0, 1),
        torch.ones(1, 2),
        beta=0.1,
        old_logprobs=old,
        ref_logprobs=ref,
        values=torch.zeros(1, 2),
    )
    # the step's beta (inputs.beta: the KL controller's) weighs the KL, not the config's starting beta
    cfg = GRPOConfig(algorithm="ppo", gamma=1.0, lam=1.0, beta=0.5, kl_in_reward=True, num_generations=1)
    out = get_algorithm("ppo").advantages(inputs, cfg.algo)
    torch.testing.assert_close(out.returns, torch.tensor([[0.975, 1.025]]))
    assert out.metrics["kl"] == pytest.approx(0.125)  # mean of [0.5, -0.25]
    # without kl_in_reward the KL stays out of the rewards (it is the loss's term)
    plain = get_algorithm("ppo").advantages(inputs, cfg.replace(kl_in_reward=False).algo)
    torch.testing.assert_close(plain.returns, torch.tensor([[1.0, 1.0]]))
