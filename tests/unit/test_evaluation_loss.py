"""Learner.evaluation_loss, TRL's eval_loss: on-policy, so the surrogate's ratio is 1 and each token's term is -A,
whatever the model's log-probs; against numbers worked out by hand, and against the training update's own loss."""

from __future__ import annotations

import copy

import pytest
import torch
from shared_helpers import sampled_batch, tiny_args

from grpokit.compose.specs import learner_spec
from grpokit.train.learning.learner import Learner
from grpokit.train.learning.policy_logprobs import completion_logprobs

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def sampled():
    return sampled_batch(2, max_completion_length=6, seed=3)


def learner(model, **settings) -> Learner:
    cfg = tiny_args(num_generations=2, prompts_per_step=1, max_completion_length=6, **settings)
    policy = copy.deepcopy(model)
    optimizer = torch.optim.SGD(policy.parameters(), lr=0.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    return Learner(policy, None, optimizer, scheduler, learner_spec(cfg))


def test_bnpo_eval_loss_by_hand(sampled):
    """beta = 0, bnpo: loss = -sum_i A_i L_i / sum_i L_i over the micro-batch's tokens, averaged over the two
    micro-batches of 2 rows; the mask is set by hand so the lengths are known: [3, 1 | 2, 2] tokens."""
    model, rollouts, batch = sampled
    mask = torch.zeros_like(rollouts.completion_mask)
    for row, length in enumerate([3, 1, 2, 2]):
        mask[row, :length] = 1.0
    advantages = torch.tensor([1.0, -1.0, 0.5, 0.25])
    # micro-batch 1: -(1 x 3 - 1 x 1) / 4 = -0.5; micro-batch 2: -(0.5 x 2 + 0.25 x 2) / 4 = -0.375; mean -0.4375
    metrics = learner(model, beta=0.0, loss_type="bnpo").evaluation_loss(batch, advantages, mask)
    assert metrics["loss"] == pytest.approx(-0.4375, abs=1e-6)
    assert "kl" not in metrics and metrics["clip_ratio/region_mean"] == 0.0  # on-policy: nothing is clipped
    with torch.no_grad():
        _, entropy = completion_logprobs(model.eval(), batch, 1.0, with_entropy=True)
    assert metrics["entropy"] == pytest.approx(float((entropy * mask).sum() / mask.sum()), abs=1e-5)


def test_eval_loss_is_the_update_loss_without_the_step(sampled):
    """The same batch through update() (learning rate 0, so its first micro-batch's weights are the eval's):
    the same loss and KL, for grpo with a KL term against a reference 0.01 away from the policy."""
    from grpokit.train.learning.reference import Reference

    model, rollouts, batch = sampled
    advantages = torch.tensor([1.0, 0.5, 0.25, -0.5])
    ours = learner(model, beta=0.1, loss_type="grpo", max_grad_norm=0.0)
    ours.reference = Reference(ours.model, use_adapters=False)
    with torch.no_grad():
        for p in ours.reference.model.parameters():
            p.add_(0.01)
    evaluated = ours.evaluation_loss(batch, advantages, rollouts.completion_mask)
    trained = ours.update(batch, advantages, rollouts.completion_mask, ours.reference_logprobs(batch))
    assert evaluated["kl"] > 0 and evaluated["kl"] == pytest.approx(trained["kl"], rel=1e-5)
    assert evaluated["loss"] == pytest.approx(trained["loss"], rel=1e-5)
