"""grpokit's PPO math computes what verl's own code computes, on the same random batch.

verl 0.9.1 (the reference; pinned in tests/verl_oracle/requirements.txt) cannot be imported next to
grpokit's test environment (it wants transformers < 5.11, and its omegaconf antlr4 4.9 where math-verify
has 4.13), so ``make verl-oracle`` installs it with --no-deps into a folder of its own and
tests/verl_oracle/compute.py runs verl's functions there, in one subprocess, on inputs this test
writes. Compared, on masked-in tokens (verl leaves numbers at padding, grpokit 0):

* GAE: ``compute_gae_advantage_return`` (its advantages are whitened: ``masked_whiten`` of ours);
* ``ppo_advantages`` (reward on the last token, k1 KL in the reward, GAE, whitening) against the KL
  penalty of verl's ``apply_kl_penalty`` (ray_trainer.py, written out in compute.py: its module needs
  more packages) followed by ``compute_gae_advantage_return``;
* ``masked_whiten`` with and without shifting the mean back;
* the clipped value loss, its clip fraction and its gradient, ``compute_value_loss`` with each
  ``loss_agg_mode`` that matches a grpokit ``loss_type``: token-mean = bnpo, token-mean with
  batch_num_tokens = dapo with num_items_in_batch, seq-mean-token-mean = grpo, seq-mean-token-sum-norm
  with loss_scale_factor = dr_grpo with max_completion_length (the last two count only non-empty
  sequences in verl, every sequence in grpokit: the batch has no empty completion);
* the policy loss (``policy_loss`` with the k3 KL term, one advantage per sequence and PPO's one per token):
  ``compute_policy_loss_vanilla`` + the KL loss as verl's actor adds it (dual clip out of reach);
* the KL in the reward: ``compute_rewards`` (k1) and ``kl_penalty`` (k1, k2, k3; verl clamps k3 to
  [-10, 10], grpokit does not, so the log-probs stay where the clamp does not bind);
* ``AdaptiveKLController`` over a run of updates;
* explained variance: ``compute_data_metrics``' critic/vf_explained_var.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from shared_helpers import loss_spec

from grpokit.algos.gae import gae_advantages, kl_in_reward, last_token_rewards, masked_whiten, ppo_advantages
from grpokit.algos.kl_control import KLController
from grpokit.algos.losses import policy_loss
from grpokit.algos.value import explained_variance, value_loss

ORACLE = Path(os.environ.get("GRPOKIT_VERL_ORACLE", Path(sys.prefix) / "verl-oracle"))
SCRIPT = Path(__file__).resolve().parents[1] / "verl_oracle" / "compute.py"
GAE_SETTINGS = [(1.0, 0.95), (0.9, 0.95), (0.99, 1.0)]
KL_STEPS = [(9.0, 256), (3.0, 256), (6.6, 256), (6.0, 64), (0.5, 1000)]
N, T = 6, 8


@pytest.fixture(scope="module")
def verl(tmp_path_factory):
    """(the inputs, verl's outputs on them)."""
    if not (ORACLE / "verl").is_dir():
        pytest.skip(f"verl reference not installed at {ORACLE}: run `make verl-oracle` (make test does)")
    generator = torch.Generator().manual_seed(11)
    lengths = torch.randint(1, T + 1, (N,), generator=generator)
    lengths[0] = T  # one completion fills the batch's width
    mask = (torch.arange(T)[None] < lengths[:, None]).long()  # [N, T] right padding, no empty row
    rand = lambda *shape: torch.randn(*shape, generator=generator, dtype=torch.float64)
    values = rand(N, T)
    inputs = {
        "mask": mask,
        "token_rewards": last_token_rewards(rand(N), mask) + 0.1 * rand(N, T) * mask,
        "values": values,
        "sequence_rewards": rand(N),
        "whiten_values": 2.0 + 3.0 * rand(N, T),
        "vpreds": values + 0.3 * rand(N, T),  # away from the old values: some tokens clip
        "returns": values + rand(N, T),
        "cliprange_value": 0.2,
        "num_items_in_batch": 40,
        "max_completion_length": 12,
        # |ref - old| < 2: k3 < e^2 - 3, inside the [-10, 10] to which verl clamps k3 (grpokit, like TRL, does not)
        "old_logprobs": -torch.rand(N, T, generator=generator, dtype=torch.float64) * 2,
        "ref_logprobs": -torch.rand(N, T, generator=generator, dtype=torch.float64) * 2,
        "beta": 0.05,
        "advantages": rand(N),
        "token_advantages": rand(N, T),  # PPO's, one per token
        "epsilon": 0.2,
        "epsilon_high": 0.28,
        "kl_loss_coef": 0.04,
        "gae_settings": GAE_SETTINGS,
        "init_kl_coef": 0.1,
        "target_kl": 6.0,
        "horizon": 10000,
        "kl_steps": KL_STEPS,
    }
    # the policy moved since sampling: ratios on both sides of the clip range
    inputs["logprobs"] = inputs["old_logprobs"] + 0.3 * rand(N, T)
    inputs["sequence_scores"] = last_token_rewards(inputs["sequence_rewards"], mask)  # verl's token_level_scores
    folder = tmp_path_factory.mktemp("verl")
    torch.save(inputs, folder / "in.pt")
    env = {**os.environ, "PYTHONPATH": str(ORACLE), "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run(
        [sys.executable, str(SCRIPT), str(folder / "in.pt"), str(folder / "out.pt")],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, f"verl's reference failed:\n{done.stderr[-3000:]}"
    return inputs, torch.load(folder / "out.pt")


def on_mask(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return x[mask.bool()]


@pytest.mark.parametrize(("gamma", "lam"), GAE_SETTINGS)
def test_gae_equals_verl(verl, gamma, lam):
    x, out = verl
    mask = x["mask"]
    advantages, returns = gae_advantages(x["token_rewards"], x["values"], mask, gamma, lam)
    verl_advantages, verl_returns = out[f"gae/{gamma}/{lam}"]
    torch.testing.assert_close(on_mask(returns, mask), on_mask(verl_returns, mask))
    torch.testing.assert_close(on_mask(masked_whiten(advantages, mask), mask), on_mask(verl_advantages, mask))


def test_ppo_advantages_equal_verl(verl):
    x, out = verl
    mask = x["mask"]
    advantages, returns, _ = ppo_advantages(
        x["sequence_rewards"],
        x["values"],
        mask,
        1.0,
        0.95,
        old_logprobs=x["old_logprobs"],
        ref_logprobs=x["ref_logprobs"],
        beta=x["beta"],
    )
    verl_advantages, verl_returns = out["pipeline"]
    torch.testing.assert_close(on_mask(advantages, mask), on_mask(verl_advantages, mask))
    torch.testing.assert_close(on_mask(returns, mask), on_mask(verl_returns, mask))


@pytest.mark.parametrize("shift_mean", [True, False])
def test_masked_whiten_equals_verl(verl, shift_mean):
    x, out = verl
    ours = masked_whiten(x["whiten_values"], x["mask"], shift_mean=shift_mean)
    torch.testing.assert_close(on_mask(ours, x["mask"]), on_mask(out[f"whiten/{shift_mean}"], x["mask"]))


@pytest.mark.parametrize("loss_type", ["bnpo", "dapo", "grpo", "dr_grpo"])
def test_value_loss_and_gradient_equal_verl(verl, loss_type):
    x, out = verl
    vpreds = x["vpreds"].clone().requires_grad_(True)
    loss, metrics = value_loss(
        vpreds,
        x["values"],
        x["returns"],
        x["mask"],
        x["cliprange_value"],
        loss_type=loss_type,
        num_items_in_batch=x["num_items_in_batch"],
        max_completion_length=x["max_completion_length"],
    )
    loss.backward()
    verl_loss, verl_clipfrac, verl_grad = out[f"value_loss/{loss_type}"]
    assert 0 < metrics["value_clip_frac"] < 1  # both branches of the max are exercised
    torch.testing.assert_close(loss.detach(), verl_loss)
    assert metrics["value_clip_frac"] == pytest.approx(float(verl_clipfrac), rel=1e-6)  # verl: float32
    torch.testing.assert_close(vpreds.grad, verl_grad)


@pytest.mark.parametrize("per_token", [False, True])
@pytest.mark.parametrize("loss_type", ["bnpo", "dapo", "grpo", "dr_grpo"])
def test_policy_loss_and_gradient_equal_verl(verl, loss_type, per_token):
    # advantages [N] (the GRPO family; verl gets A_i on every token) or [N, T] (PPO's, as verl's are)
    x, out = verl
    logprobs = x["logprobs"].clone().requires_grad_(True)
    loss, metrics = policy_loss(
        logprobs,
        x["old_logprobs"],
        x["token_advantages"] if per_token else x["advantages"],
        x["mask"],
        loss_spec(
            loss_type=loss_type,
            epsilon=x["epsilon"],
            epsilon_high=x["epsilon_high"],
            beta=x["kl_loss_coef"],
            max_completion_length=x["max_completion_length"],
        ),
        ref_logprobs=x["ref_logprobs"],
        num_items_in_batch=x["num_items_in_batch"],
    )
    loss.backward()
    assert 0 < metrics["clip_ratio/low_mean"] and 0 < metrics["clip_ratio/high_mean"]  # both clips active
    verl_loss, verl_grad = out[f"policy_loss{'_token' if per_token else ''}/{loss_type}"]
    torch.testing.assert_close(loss.detach(), verl_loss)
    torch.testing.assert_close(logprobs.grad, verl_grad)


@pytest.mark.parametrize("kind", ["k1", "k2", "k3"])
def test_kl_in_reward_equals_verl(verl, kind):
    x, out = verl
    mask = x["mask"]
    rewards, kl = kl_in_reward(x["token_rewards"], x["old_logprobs"], x["ref_logprobs"], mask, x["beta"], kind)
    torch.testing.assert_close(on_mask(kl, mask), on_mask(out[f"kl/{kind}"], mask))
    if kind == "k1":  # compute_rewards: token_level_scores - kl * kl_ratio
        torch.testing.assert_close(on_mask(rewards, mask), on_mask(out["rewards/k1"], mask))


def test_adaptive_kl_controller_equals_verl(verl):
    x, out = verl
    controller = KLController(beta=x["init_kl_coef"], target_kl=x["target_kl"], horizon=x["horizon"])
    betas = [controller.update(kl, n_steps) for kl, n_steps in KL_STEPS]
    assert betas == pytest.approx(out["adaptive_kl"], rel=1e-12)


def test_explained_variance_equals_verl(verl):
    x, out = verl
    ours = explained_variance(x["values"], x["returns"], x["mask"])
    assert float(ours) == pytest.approx(out["explained_variance"], rel=1e-6)
