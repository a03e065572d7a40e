"""PPO's critic in training (train/learning/critic.py): its step is the value loss of the whole mini-batch, whatever the
micro-batches; its metrics are value_loss's; it starts from the policy's trunk."""

from __future__ import annotations

import pytest
import torch

from grpokit.algos.value import value_loss
from grpokit.compose.learner import build_critic
from grpokit.config import GRPOConfig
from grpokit.models.loading import load_model
from grpokit.rollout.types import Rollouts
from grpokit.train.learning.critic import Critic
from grpokit.train.learning.policy_logprobs import build_batch

pytestmark = pytest.mark.usefixtures("one_thread")
CPU = torch.device("cpu")
PROMPTS = [[5, 6, 7], [8, 9]]
G, T = 2, 4
LENGTHS = [4, 2, 3, 1]


def batch_and_targets():
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(4, 40, (len(PROMPTS) * G, T), generator=generator)
    mask = (torch.arange(T)[None] < torch.tensor(LENGTHS)[:, None]).float()
    rollouts = Rollouts(PROMPTS, torch.where(mask.bool(), ids, 0), mask, torch.zeros(ids.shape), ["length"] * 4, G)
    returns = torch.randn(len(LENGTHS), T, generator=generator) * mask
    return rollouts, mask, returns


def build(tiny_model_dir, micro_batch: int, loss_type: str) -> Critic:
    cfg = GRPOConfig(
        algorithm="ppo",
        num_generations=G,
        per_device_train_batch_size=micro_batch,
        gradient_accumulation_steps=4 // micro_batch,
        loss_type=loss_type,
        learning_rate=1e-2,
        max_steps=1,
        cliprange_value=0.05,
        vf_coef=0.5,
    )
    torch.manual_seed(0)  # the head's init
    policy = load_model(str(tiny_model_dir), torch.float32, CPU)
    return build_critic(policy, cfg, CPU, autocast_dtype=None, kernels=None)  # dtype auto: float32 on a CPU


@pytest.mark.parametrize("loss_type", ["dapo", "bnpo"])
def test_a_step_over_micro_batches_is_the_value_loss_of_the_mini_batch(tiny_model_dir, loss_type):
    rollouts, mask, returns = batch_and_targets()
    whole, split = build(tiny_model_dir, 4, loss_type), build(tiny_model_dir, 2, loss_type)
    batch = build_batch(whole.model.trunk, rollouts, 0, CPU)
    old_values = whole.values(batch)  # [N, T], no gradient
    torch.testing.assert_close(split.values(batch), old_values)  # the same weights
    assert not old_values.requires_grad and torch.equal(old_values == 0, mask == 0)
    # one step on old values nudged away from the returns, so some tokens clip
    old = old_values + 0.1 * mask
    num_items = mask.sum()
    expected, parts = value_loss(old_values, old, returns, mask, 0.05, 0.5, loss_type, num_items_in_batch=num_items)
    metrics = {}
    for critic in (whole, split):
        metrics[critic] = critic.step(batch, old, returns, mask, num_items=num_items)
    # the metric is the mini-batch's value loss before vf_coef (dapo: micro-batch parts add up to it)
    assert metrics[whole]["value_loss"] == pytest.approx(parts["value_loss"], rel=1e-6)
    assert metrics[whole]["value_loss"] == pytest.approx(float(expected) / 0.5, rel=1e-6)
    assert metrics[whole]["value_clip_frac"] == pytest.approx(parts["value_clip_frac"])
    assert metrics[whole]["nonfinite"] == 0.0 and metrics[whole]["critic/learning_rate"] == pytest.approx(1e-2)
    if loss_type == "dapo":  # token sums over the batch's tokens: micro-batches change nothing
        assert metrics[split]["value_loss"] == pytest.approx(metrics[whole]["value_loss"], rel=1e-5)
        # the gradient (its norm: AdamW's first step is blind to the gradient's scale) and the step
        assert metrics[split]["critic/grad_norm"] == pytest.approx(metrics[whole]["critic/grad_norm"], rel=1e-5)
        for a, b in zip(whole.model.parameters(), split.model.parameters()):
            # steps of ~lr = 1e-2; AdamW divides a near-zero gradient by its own size, which magnifies rounding there
            torch.testing.assert_close(a, b, atol=1e-4, rtol=0)
    # the step moved the critic: its new values differ
    assert not torch.allclose(whole.values(batch), old_values)


def test_the_critic_starts_from_the_policy_s_trunk_and_state_round_trips(tiny_model_dir):
    critic = build(tiny_model_dir, 4, "dapo")
    policy = load_model(str(tiny_model_dir), torch.float32, CPU)
    for name, p in policy.get_decoder().named_parameters():
        torch.testing.assert_close(critic.model.trunk.get_parameter(name), p)
    assert all(p.requires_grad for p in critic.model.parameters())  # full fine-tuning without lora
    # its AdamW's state is made when it is built (schedule.allocate_state): step 0, zero moments, every parameter
    states = [critic.optimizer.state[p] for p in critic.model.parameters()]
    assert all(float(s["step"]) == 0 and not s["exp_avg"].any() and not s["exp_avg_sq"].any() for s in states)
    rollouts, mask, returns = batch_and_targets()
    batch = build_batch(critic.model.trunk, rollouts, 0, CPU)
    critic.step(batch, critic.values(batch), returns, mask, num_items=mask.sum())
    module, states = critic.state()
    fresh = build(tiny_model_dir, 4, "dapo")
    fresh.model.load_state_dict(module.state_dict())
    fresh.load_states(states)
    assert fresh.scheduler.state_dict() == critic.scheduler.state_dict()
    assert fresh.optimizer.state_dict()["state"].keys() == critic.optimizer.state_dict()["state"].keys()
