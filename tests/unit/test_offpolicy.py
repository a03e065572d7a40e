"""Off-policy corrections (grpokit/algos/offpolicy.py) against numbers worked out by hand."""

from __future__ import annotations

import math

import pytest
import torch
from shared_helpers import loss_spec

from grpokit.algos import policy_loss
from grpokit.algos.offpolicy import CORRECTIONS, behaviour_weights, get_correction, weight_metrics

L2, L3 = math.log(2.0), math.log(3.0)
# Two sequences, three token slots, the second sequence two tokens long (its third slot is padding).
PROXIMAL = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -0.7, -9.0]])
# log(pi_prox / mu) per token: row 0 [ln 2, -ln 2, ln 4] -> rho [2, 0.5, 4]; row 1 [0, ln 3, (pad)] -> [1, 3, -]
DIFF = torch.tensor([[L2, -L2, 2 * L2], [0.0, L3, 5.0]])
BEHAVIOUR = PROXIMAL - DIFF
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])  # 5 real tokens


def weights(mode, low, high):
    return behaviour_weights(PROXIMAL, BEHAVIOUR, MASK, mode, low, high)


def test_token_truncate_caps_each_token():
    # rho [2, 0.5, 4 | 1, 3, pad 1] clamped at 3: [2, 0.5, 3 | 1, 3, 1]; clipped: 4 -> 3 and 3 (at the bound): 2 of 5
    found = weights("token_truncate", None, 3.0)
    torch.testing.assert_close(found.weights, torch.tensor([[2.0, 0.5, 3.0], [1.0, 3.0, 1.0]]))
    m = weight_metrics(found, MASK)
    assert m["sampling_is/capped_fraction"] == pytest.approx(2 / 5)
    assert m["sampling_is/masked_fraction"] == 0.0
    # mean over real tokens (2 + 0.5 + 3 + 1 + 3) / 5 = 1.9; max 3, min 0.5
    assert m["sampling_is/weight_mean"] == pytest.approx(1.9)
    assert (m["sampling_is/weight_max"], m["sampling_is/weight_min"]) == pytest.approx((3.0, 0.5))


def test_token_mask_zeroes_tokens_outside_the_range():
    # range [0.6, 3]: 0.5 < 0.6 and 4 > 3 are masked; 3 is inside (TRL masks strictly outside): [2, 0, 0 | 1, 3, 1]
    found = weights("token_mask", 0.6, 3.0)
    torch.testing.assert_close(found.weights, torch.tensor([[2.0, 0.0, 0.0], [1.0, 3.0, 1.0]]))
    m = weight_metrics(found, MASK)
    assert m["sampling_is/masked_fraction"] == pytest.approx(2 / 5)
    assert m["sampling_is/capped_fraction"] == 0.0


def test_sequence_mask_is_masked_importance_sampling():
    # sequence ratios: row 0 exp(ln 2 - ln 2 + ln 4) = 4, row 1 exp(0 + ln 3) = 3 (padding's 5.0 not counted)
    # MIS with [None, 3.5]: row 0 (4 > 3.5) is left out whole, row 1 keeps its ratio 3 on every token
    found = weights("sequence_mask", None, 3.5)
    torch.testing.assert_close(found.weights, torch.tensor([[0.0, 0.0, 0.0], [3.0, 3.0, 3.0]]))
    assert weight_metrics(found, MASK)["sampling_is/masked_fraction"] == pytest.approx(3 / 5)  # row 0's 3 tokens
    # a lower bound masks too: [3.2, 5] keeps row 0 (4) and drops row 1 (3 < 3.2)
    found = weights("sequence_mask", 3.2, 5.0)
    torch.testing.assert_close(found.weights, torch.tensor([[4.0, 4.0, 4.0], [0.0, 0.0, 0.0]]))


def test_sequence_truncate_clamps_the_sequence_ratio():
    # [3.2, 3.5]: row 0's 4 -> 3.5, row 1's 3 -> 3.2; every real token clipped
    found = weights("sequence_truncate", 3.2, 3.5)
    torch.testing.assert_close(found.weights, torch.tensor([[3.5, 3.5, 3.5], [3.2, 3.2, 3.2]]))
    assert weight_metrics(found, MASK)["sampling_is/capped_fraction"] == pytest.approx(1.0)


def test_a_missing_sampler_logprob_counts_as_ratio_one():
    behaviour = BEHAVIOUR.clone()
    behaviour[0, 0] = float("nan")  # row 0: [0, -ln 2, ln 4] -> sequence ratio 2
    found = behaviour_weights(PROXIMAL, behaviour, MASK, "sequence_truncate", None, 10.0)
    assert found.weights[0, 0].item() == pytest.approx(2.0)


def test_unknown_mode_and_correction_name_the_choices():
    with pytest.raises(ValueError, match="token_truncate, token_mask, sequence_truncate, sequence_mask"):
        weights("sequence", None, 3.0)
    with pytest.raises(ValueError, match="behaviour, decoupled_ppo"):
        get_correction("areal")
    assert CORRECTIONS["decoupled_ppo"].weighs_behaviour and not CORRECTIONS["decoupled_ppo"].clip_to_behaviour
    assert CORRECTIONS["behaviour"].clip_to_behaviour and not CORRECTIONS["behaviour"].weighs_behaviour


def test_decoupled_ppo_clips_around_the_proximal_policy_and_weighs_by_the_behaviour_ratio():
    # One sequence, two tokens, A = 1, epsilon 0.2, bnpo (token mean).
    # pi_theta / pi_prox = [1.5, 1]; pi_prox / mu = [2, 4] (truncated at 3 -> [2, 3])
    proximal = torch.tensor([[-1.0, -1.0]])
    logprobs = (proximal + torch.tensor([[math.log(1.5), 0.0]])).requires_grad_()
    behaviour = proximal - torch.tensor([[L2, 2 * L2]])
    mask, adv = torch.ones(1, 2), torch.ones(1)
    spec = loss_spec(loss_type="bnpo", epsilon=0.2, sampling_cap=3.0)
    # decoupled: token 1 -min(1.5, 1.2) * 2 = -2.4, token 2 -min(1, 1) * 3 = -3; mean -2.7
    loss, m = policy_loss(logprobs, proximal, adv, mask, spec, sampling_logprobs=behaviour)
    assert loss.item() == pytest.approx(-2.7)
    assert m["clip_ratio/high_mean"] == pytest.approx(0.5)  # token 1 is outside the proximal trust region
    assert m["sampling_is/capped_fraction"] == pytest.approx(0.5)
    loss.backward()
    # token 1 is clipped (no gradient); token 2: d(-3 * r)/d logp = -3 * r = -3, over 2 tokens: -1.5
    torch.testing.assert_close(logprobs.grad, torch.tensor([[0.0, -1.5]]))
    # plain PPO off-policy (ratio to the behaviour policy): r = [3, 4], both clipped at 1.2: -1.2, no gradient at all
    logprobs.grad = None
    loss, _ = policy_loss(logprobs, behaviour, adv, mask, spec)
    assert loss.item() == pytest.approx(-1.2)
    loss.backward()
    torch.testing.assert_close(logprobs.grad, torch.zeros(1, 2))


def test_decoupled_ppo_with_sequence_mis_drops_a_too_stale_sequence():
    # Two one-token sequences, A = [1, 1], r = 1 (theta = prox). pi_prox / mu = [2, 5]; sequence_mask [None, 3]
    # keeps sequence 0 with weight 2 and drops sequence 1: bnpo loss (-1 * 2 + 0) / 2 = -1
    proximal = torch.tensor([[-1.0], [-1.0]])
    behaviour = proximal - torch.tensor([[L2], [math.log(5.0)]])
    spec = loss_spec(loss_type="bnpo", sampling_cap=3.0, sampling_is_mode="sequence_mask")
    loss, m = policy_loss(
        proximal.clone(), proximal, torch.ones(2), torch.ones(2, 1), spec, sampling_logprobs=behaviour
    )
    assert loss.item() == pytest.approx(-1.0)
    assert m["sampling_is/masked_fraction"] == pytest.approx(0.5)
