"""TRL's extra loss terms, each against numbers worked out by hand: the entropy bonus and its adaptive control
(Skywork-OR1), the MoE router's coefficient rule, the separate sampler's (vLLM's) importance weights in each of TRL's
four modes (``vllm_importance_sampling_mode``, shaped by ``algos.offpolicy.behaviour_weights``), the sequence-level
warning and GDPO's normalize_then_sum."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from shared_helpers import loss_spec

from grpokit.algos.entropy_bonus import EntropyController, adaptive_entropy_coef, mean_entropy
from grpokit.algos.level_warnings import sequence_level_warning
from grpokit.algos.offpolicy import behaviour_weights
from grpokit.algos.router_aux import router_aux_settings, router_aux_term

MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])  # 3 tokens: two of row 0, one of row 1


def entropy_controller(**given) -> EntropyController:
    """TRL's entropy-bonus defaults (entropy_target 0.2, entropy_coef_delta 0.005, range [0, 1]), bonus off, with
    ``given`` changed (the run's come from its config)."""
    base = dict(coef=0.0, adaptive=False, target=0.2, delta=0.005, low=0.0, high=1.0)
    return EntropyController(**{**base, **given})


def test_mean_entropy_by_hand():
    entropy = torch.tensor([[1.0, 2.0, 9.0], [3.0, 9.0, 9.0]], requires_grad=True)
    # (1 + 2 + 3) / 3 tokens = 2; padding (the 9s) left out
    h = mean_entropy(entropy, MASK)
    assert h.item() == pytest.approx(2.0)
    h.backward()  # differentiable: d H / d entropy = mask / 3
    torch.testing.assert_close(entropy.grad, torch.tensor([[1 / 3, 1 / 3, 0.0], [1 / 3, 0.0, 0.0]]))
    # a chunk of rows divides by the whole micro-batch's tokens: row 0 alone over 3 tokens = 3 / 3 = 1, row 1 = 1
    assert mean_entropy(entropy[:1], MASK[:1], 3.0).item() == pytest.approx(1.0)
    assert mean_entropy(entropy[1:], MASK[1:], 3.0).item() == pytest.approx(1.0)  # 1 + 1 = the micro-batch's 2
    assert mean_entropy(entropy, torch.zeros(2, 3)).item() == 0.0  # no token: 0 / max(0, 1)


def test_adaptive_coefficient_by_hand():
    # below the target: up by delta; above: down; clamped to [low, high]
    assert adaptive_entropy_coef(0.01, 0.1, 0.2, 0.005, 0.0, 1.0) == pytest.approx(0.015)
    assert adaptive_entropy_coef(0.01, 0.2, 0.2, 0.005, 0.0, 1.0) == pytest.approx(0.015)  # at the target: up
    assert adaptive_entropy_coef(0.01, 0.3, 0.2, 0.005, 0.0, 1.0) == pytest.approx(0.005)
    assert adaptive_entropy_coef(0.003, 0.3, 0.2, 0.005, 0.0, 1.0) == 0.0  # max(-0.002, 0)
    assert adaptive_entropy_coef(0.998, 0.1, 0.2, 0.005, 0.0, 1.0) == 1.0  # min(1.003, 1)


def test_static_controller_applies_its_coefficient_every_step():
    c = entropy_controller(coef=0.1)
    assert c.enabled and c.applied() == 0.1
    c.observe(5.0, 2.0)
    assert c.step() == 0.1 and c.applied() == 0.1  # static: never moves
    assert not entropy_controller(coef=0.0).enabled
    assert entropy_controller(coef=0.0, adaptive=True).enabled  # adaptive at 0 can come back


def test_adaptive_controller_over_three_steps_by_hand():
    c = entropy_controller(coef=0.01, adaptive=True, target=0.5, delta=0.005, low=0.0, high=0.02)
    assert c.applied() == 0.0  # no measurement yet (last entropy inf > target): no bonus on the first step
    # step 1: micro-batches of (sum 1.2 over 4 tokens) and (0.4 over 4): 1.6 / 8 = 0.2 <= 0.5 -> 0.015
    c.observe(1.2, 4)
    c.observe(0.4, 4)
    assert c.step() == pytest.approx(0.015) and c.last_entropy == pytest.approx(0.2)
    assert c.applied() == pytest.approx(0.015)  # the measured entropy is under the target: applies
    # step 2: 6 / 6 = 1.0 > 0.5 -> 0.010, and the bonus is off for step 3
    c.observe(6.0, 6)
    assert c.step() == pytest.approx(0.010) and c.applied() == 0.0
    # step 3: 0.1 / 1 -> up to 0.015, then 0.020, then the cap 0.02 holds
    for expected in (0.015, 0.020, 0.020):
        c.observe(0.1, 1)
        assert c.step() == pytest.approx(expected)
    # the processes' sums are reduced before the measurement: (0.1 + 9.9) / (1 + 1) = 5 > 0.5 -> down
    c.observe(0.1, 1)
    assert c.step(reduce=lambda v: [v[0] + 9.9, v[1] + 1]) == pytest.approx(0.015)
    assert c.last_entropy == pytest.approx(5.0)
    state = c.state_dict()
    fresh = entropy_controller(coef=0.01, adaptive=True, target=0.5)
    fresh.load_state_dict(state)
    assert (fresh.coef, fresh.last_entropy) == (pytest.approx(0.015), pytest.approx(5.0))


def test_router_aux_rule():
    moe = SimpleNamespace(output_router_logits=False, router_aux_loss_coef=0.001)
    dense = SimpleNamespace()
    assert router_aux_settings(None, moe) == (0.001, True)  # the model's own coefficient
    assert router_aux_settings(0.02, moe) == (0.02, True)  # the run's wins
    assert router_aux_settings(0.0, moe) == (0.0, False)  # 0 turns it off
    assert router_aux_settings(None, SimpleNamespace(output_router_logits=False)) == (0.0, False)  # no coefficient
    assert router_aux_settings(None, dense) == (0.0, False)
    with pytest.raises(ValueError, match="not a mixture-of-experts"):
        router_aux_settings(0.01, dense)
    # 0.02 x 1.5 / 2 accumulation steps = 0.015
    assert router_aux_term(torch.tensor(1.5), 0.02, 2).item() == pytest.approx(0.015)


def test_sampler_weights_in_each_mode_by_hand():
    def weights(mode, low, high):
        return behaviour_weights(old, q, mask, mode, low, high).weights

    # log p_old - log q per token: row 0: ln 2, ln 4, (padding); row 1: -ln 4, NaN (no sampler log-prob) -> 0
    old = torch.tensor([[math.log(2), math.log(4), 5.0], [-math.log(4), 0.0, 0.0]])
    q = torch.tensor([[0.0, 0.0, 0.0], [0.0, float("nan"), 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]])
    # token_truncate, clips [0.5, 3]: [2, 4 -> 3, exp(0) = 1], [0.25 -> 0.5, 1, 1]
    torch.testing.assert_close(weights("token_truncate", 0.5, 3.0), torch.tensor([[2.0, 3.0, 1.0], [0.5, 1.0, 1.0]]))
    assert weights("token_truncate", None, 3.0)[1, 0].item() == pytest.approx(0.25)  # no lower clip (TRL's None)
    # token_mask: outside [0.5, 3] -> 0: 4 and 0.25 masked
    torch.testing.assert_close(weights("token_mask", 0.5, 3.0), torch.tensor([[2.0, 0.0, 1.0], [0.0, 1.0, 1.0]]))
    # sequence level: row 0 exp(ln 2 + ln 4) = 8, row 1 exp(-ln 4 + 0) = 0.25, shared by the row's tokens
    torch.testing.assert_close(weights("sequence_truncate", 0.5, 3.0)[:, 0], torch.tensor([3.0, 0.5]))
    torch.testing.assert_close(weights("sequence_mask", None, 3.0)[:, 0], torch.tensor([0.0, 0.25]))


@pytest.mark.parametrize(
    ("loss_type", "aggregation", "warned"),
    [
        ("grpo", "grpo", False),
        ("bnpo", "bnpo", True),
        ("dr_grpo", "dr_grpo", True),
        ("dapo", "dapo", True),
        ("cispo", "dapo", True),
        ("luspo", "luspo", False),
        ("sapo", "grpo", False),
        ("vespo", "dapo", False),
    ],
)
def test_sequence_level_warning_for_token_summed_losses(loss_type, aggregation, warned):
    message = sequence_level_warning("sequence", loss_type, aggregation)
    assert (message is not None) == warned
    if warned:
        assert "weights each sequence by its completion length" in message and f"'{loss_type}'" in message
    assert sequence_level_warning("token", loss_type, aggregation) is None


def test_policy_loss_applies_the_sampler_mode():
    from grpokit.algos import policy_loss

    # on-policy (ratio 1), grpo: each token's term is -A x w. Sequence weights as above: row 0 exp(ln 8) = 8 is
    # outside [0, 3] -> 0, row 1 exp(-ln 4) = 0.25. Loss = mean(mean(-1 x 0, -1 x 0), mean(-2 x 0.25, -2 x 0.25))
    # = mean(0, -0.5) = -0.25; token_truncate instead: row 0 tokens 2, 3 (ln 4 capped), row 1 0.25, 1:
    # mean(mean(-2, -3), mean(-0.5, -2)) = mean(-2.5, -1.25) = -1.875
    logprobs = torch.tensor([[math.log(2), math.log(4), 0.0], [-math.log(4), 0.0, 0.0]], requires_grad=True)
    q = torch.tensor([[0.0, 0.0, 0.0], [0.0, float("nan"), 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]])
    advantages = torch.tensor([1.0, 2.0])
    for mode, expected in (("sequence_mask", -0.25), ("token_truncate", -1.875)):
        spec = loss_spec(loss_type="grpo", sampling_is_mode=mode, sampling_cap=3.0)
        loss, _ = policy_loss(logprobs, None, advantages, mask, spec, sampling_logprobs=q)
        assert loss.item() == pytest.approx(expected), mode


def test_normalize_then_sum_by_hand():
    from grpokit.algos.multi_objective import batch_normalized, normalize_then_sum

    # one group of 2, two functions, weights (1, 2). f0: 0, 2 -> mean 1, unbiased std sqrt(2) -> z = -/+ 1/sqrt(2);
    # f1: 5, 5 -> std 0 -> z = 0, 0. x = (-0.7071, 0.7071) (f1 adds nothing)
    per_func = torch.tensor([[0.0, 5.0], [2.0, 5.0]])
    x = normalize_then_sum(per_func, torch.tensor([1.0, 2.0]), 2)
    s = 1 / math.sqrt(2) / (1 + 1e-4 / math.sqrt(2))  # 1 / (sqrt 2 + 1e-4)
    torch.testing.assert_close(x, torch.tensor([-s, s]))
    # batch: mean 0, unbiased std sqrt(2) s -> A = -/+ s / (sqrt(2) s + 1e-4) ~ -/+ 0.7071
    a = batch_normalized(x)
    torch.testing.assert_close(a, torch.tensor([-s, s]) / (math.sqrt(2) * s + 1e-4))
    # a NaN reward is left out: f0 (0, NaN) -> mean 0, one value -> std NaN: z NaN, dropped; only f1 counts
    # (f1: 1, 3 -> z = -/+ 2 / (sqrt 2 + 1e-4) ... x2 weight); a row with no reward at all is NaN, advantage 0
    per_func = torch.tensor([[0.0, 1.0], [float("nan"), 3.0], [float("nan"), float("nan")], [1.0, 1.0]])
    x = normalize_then_sum(per_func, torch.tensor([1.0, 2.0]), 2)
    z1 = 1 / (math.sqrt(2) + 1e-4)  # (3 - 2) / (sqrt 2 + eps)
    torch.testing.assert_close(x[:2], torch.tensor([-2 * z1, 2 * z1]))
    assert x[2].isnan() and x[3].item() == 0.0  # the second group: one present row, its std NaN -> nansum 0
    assert batch_normalized(x)[2].item() == 0.0
