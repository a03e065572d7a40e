"""The registered losses beyond the clipped surrogate (cispo, sapo, luspo, vespo), the masks policy_loss applies
(off-policy sequences, high-entropy tokens), two-sided clipping, and the loss registry itself; by hand."""

from __future__ import annotations

import math

import pytest
import torch
from shared_helpers import loss_spec

from grpokit.algos import aggregate, high_entropy_mask, off_policy_sequence_mask, policy_loss
from grpokit.algos.loss_registry import LOSSES, get_loss, loss_types, register_loss
from grpokit.algos.token_masks import quantile
from grpokit.algos.vespo import gamma_weights

LN2 = math.log(2.0)
# The hand setting of test_algos_losses.py: 2 sequences x 3 tokens, the last token of sequence 2 is padding;
# old = 0, logp = log r, advantages [1, -1].
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
RATIOS = torch.tensor([[1.0, 1.5, 0.5], [1.1, 0.7, 3.0]])
ADVANTAGES = torch.tensor([1.0, -1.0])


def _logprobs():
    return RATIOS.log().requires_grad_(True), torch.zeros(2, 3)


def test_the_registry_lists_every_loss_and_how_it_normalises():
    assert loss_types() == ("grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo", "vespo")
    aggregation = {name: get_loss(name).aggregation for name in loss_types()}
    assert aggregation == {
        "grpo": "grpo",
        "bnpo": "bnpo",
        "dr_grpo": "dr_grpo",
        "dapo": "dapo",
        "cispo": "dapo",  # MiniMax-M1: 1 / (tokens of the batch)
        "sapo": "grpo",  # the SAPO paper: each sequence's token mean, then the mean over sequences
        "luspo": "luspo",
        "vespo": "dapo",
    }
    # the learner sums the micro-batch losses of a batch-normalised loss, else averages them
    assert [name for name in loss_types() if get_loss(name).batch_normalised] == ["dapo", "cispo", "vespo"]
    assert get_loss("dapo").micro_batch_divisor(4) == 1 and get_loss("grpo").micro_batch_divisor(4) == 4
    with pytest.raises(ValueError, match=r"unknown loss_type 'ppo'; valid choices: grpo, bnpo, .*, vespo"):
        get_loss("ppo")


def test_register_loss_refuses_a_taken_name_and_an_unknown_aggregation():
    with pytest.raises(ValueError, match=r"loss_type 'dapo' is registered already .*clipped_surrogate"):
        register_loss("dapo", aggregation="dapo")(lambda terms, spec: (terms.ratio, {}))
    with pytest.raises(ValueError, match="unknown aggregation 'mean'; valid choices: grpo, bnpo, dr_grpo, dapo, luspo"):
        register_loss("toy", aggregation="mean")
    assert "toy" not in LOSSES


def test_a_registered_loss_runs_in_policy_loss():
    # l = -A * logp (REINFORCE), token mean (bnpo): seq 1 logp [0, ln1.5, ln0.5] A=1, seq 2 [ln1.1, ln0.7] A=-1
    # sum = -(0 + 0.405465 - 0.693147) + (0.095310 - 0.356675) = 0.287682 - 0.261365 = 0.026317; / 5 = 0.0052634
    def reinforce(terms, spec):
        return -terms.advantages * terms.logprobs, {"toy/count": 1.0}

    register_loss("reinforce_test", aggregation="bnpo")(reinforce)
    try:
        logprobs, old = _logprobs()
        loss, metrics = policy_loss(logprobs, old, ADVANTAGES, MASK, loss_spec(loss_type="reinforce_test"))
        assert loss.item() == pytest.approx(0.0052634, abs=1e-6)
        assert metrics["toy/count"] == 1.0 and metrics["ratio_mean"] == pytest.approx(0.96)
    finally:
        del LOSSES["reinforce_test"]


# --- cispo ---------------------------------------------------------------------------------------


def test_cispo_by_hand():
    # cap epsilon_high = 1.2 (the weight itself, ScaleRL's epsilon_max); l = -sg(min(r, 1.2)) A logp:
    #   seq 1 (A = 1):  r=1: -1 * 0 = 0;  r=1.5: -1.2 * ln1.5 = -0.486558;  r=0.5: -0.5 * ln0.5 = 0.346574
    #   seq 2 (A = -1): r=1.1: 1.1 * ln1.1 = 0.104841;  r=0.7: 0.7 * ln0.7 = -0.249672
    # sum = -0.284816; dapo over num_items_in_batch = 8: -0.0356020
    logprobs, old = _logprobs()
    spec = loss_spec(loss_type="cispo", epsilon_high=1.2)
    loss, metrics = policy_loss(logprobs, old, ADVANTAGES, MASK, spec, num_items_in_batch=8)
    assert loss.item() == pytest.approx(-0.0356020, abs=1e-6)
    assert metrics["cispo_clip_ratio"] == pytest.approx(0.2)  # r=1.5 > 1.2 with A > 0: 1 token of 5
    assert "clip_ratio/high_mean" not in metrics
    loss.backward()
    # every token keeps a gradient (the capped one too): -w A / 8 = seq 1 [-1, -1.2, -0.5] / 8, seq 2 [1.1, 0.7] / 8
    torch.testing.assert_close(logprobs.grad, torch.tensor([[-0.125, -0.15, -0.0625], [0.1375, 0.0875, 0.0]]))


# --- sapo ----------------------------------------------------------------------------------------


def test_sapo_by_hand():
    # f(r) = sigmoid(tau (r - 1)) * 4 / tau, tau 1 for A > 0 and 1.05 for A <= 0; l = -f(r) A; grpo aggregation.
    #   seq 1 (tau 1): f(1) = 2, f(1.5) = 4 sigmoid(0.5) = 2.489837, f(0.5) = 4 sigmoid(-0.5) = 1.510163;
    #     token mean of -f: -(2 + 2.489837 + 1.510163) / 3 = -2 (sigmoid(x) + sigmoid(-x) = 1)
    #   seq 2 (tau 1.05): f(1.1) = sigmoid(0.105) * 4 / 1.05 = 2.004670, f(0.7) = sigmoid(-0.315) * 4 / 1.05 =
    #     1.607218; token mean of +f: 1.805944
    # mean over sequences: (-2 + 1.805944) / 2 = -0.0970279
    logprobs, old = _logprobs()
    loss, metrics = policy_loss(logprobs, old, ADVANTAGES, MASK, loss_spec(loss_type="sapo"))
    assert loss.item() == pytest.approx(-0.0970279, abs=1e-6)
    assert set(metrics) == {"ratio_mean", "policy_loss"}
    # tau_pos = 2: seq 1 f(1) = 4 sigmoid(0) / 2 = 1, f(1.5) = 2 sigmoid(1), f(0.5) = 2 sigmoid(-1); sum 3, mean -1;
    # (-1 + 1.805944) / 2 = 0.402972
    from grpokit.algos.loss_params import SapoParams

    spec = loss_spec(loss_type="sapo", params=SapoParams(sapo_temperature_pos=2.0))
    loss = policy_loss(logprobs, old, ADVANTAGES, MASK, spec)[0]
    assert loss.item() == pytest.approx(0.402972, abs=1e-6)


def test_sapo_on_policy_gradient_is_the_policy_gradient():
    # r = 1: d/dlogp of -f(r) A = -4 s (1 - s) r A = -A (s = sigmoid(0) = 1/2), whatever tau; grpo: / (|o_i| N)
    logprobs = torch.randn(2, 3, requires_grad=True)
    from grpokit.algos.loss_params import SapoParams

    spec = loss_spec(loss_type="sapo", params=SapoParams(sapo_temperature_pos=3.0, sapo_temperature_neg=0.5))
    policy_loss(logprobs, None, torch.tensor([1.0, -2.0]), MASK, spec)[0].backward()
    torch.testing.assert_close(logprobs.grad, torch.tensor([[-1 / 6] * 3, [2 / 4, 2 / 4, 0.0]]))


# --- luspo ---------------------------------------------------------------------------------------


def test_luspo_by_hand():
    # the clipped surrogate per token (test_algos_losses.py): seq 1 [-1, -1.2, -0.5], seq 2 [1.1, 0.8];
    # luspo: each sequence's token sum, then the mean over sequences: (-2.7 + 1.9) / 2 = -0.4
    logprobs, old = _logprobs()
    loss, metrics = policy_loss(logprobs, old, ADVANTAGES, MASK, loss_spec(loss_type="luspo"))
    assert loss.item() == pytest.approx(-0.4, abs=1e-6)
    assert metrics["clip_ratio/high_mean"] == pytest.approx(0.2)
    # sequence level (its paper's setup): log ratios seq 1 [0.3, -0.1, 0.1] -> mean 0.1, seq 2 [0.2, 0.4] -> 0.3;
    # r = [e^0.1, e^0.3 clipped to 1.2], A = 1: per token [-1.105171] x 3 and [-1.2] x 2;
    # luspo = (3 x -1.105171 + 2 x -1.2) / 2 = -2.857756 (GSPO's grpo would give (-1.105171 - 1.2) / 2)
    gspo = torch.tensor([[0.3, -0.1, 0.1], [0.2, 0.4, 9.0]])
    spec = loss_spec(loss_type="luspo", importance_sampling_level="sequence")
    assert policy_loss(gspo, torch.zeros(2, 3), torch.ones(2), MASK, spec)[0].item() == pytest.approx(-2.857756)
    # the aggregation on its own: (1 + 2 + 3) and (4 + 5) -> mean 7.5
    values = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    assert aggregate(values, MASK, "luspo").item() == pytest.approx(7.5)


# --- vespo ---------------------------------------------------------------------------------------

# phi(w) = w^k exp(lambda (1 - w)), (k, lambda) = (2, 3) for A >= 0 and (3, 2) for A < 0 (the defaults)
VESPO_LOGP = torch.tensor([[-1.0, -2.0], [-0.5, 0.0], [-1.0, -3.0]])
VESPO_LOG_RATIO = torch.tensor([[LN2, -LN2], [LN2, 5.0], [-LN2, 0.0]])  # w = 1, 2 (5.0 is padding), 0.5
VESPO_MASK = torch.tensor([[1.0, 1.0], [1.0, 0.0], [1.0, 1.0]])
VESPO_ADVANTAGES = torch.tensor([1.0, -1.0, 0.5])


def test_vespo_weights_by_hand():
    # seq 1: w = 2 * 0.5 = 1, phi = 1;  seq 2 (A < 0): w = 2, phi = 2^3 e^(2 (1 - 2)) = 8 e^-2 = 1.082682;
    # seq 3: w = 0.5, phi = 0.25 e^(3 x 0.5) = 1.120422
    phi = gamma_weights(VESPO_LOG_RATIO, VESPO_ADVANTAGES[:, None], VESPO_MASK, loss_spec(loss_type="vespo"))
    torch.testing.assert_close(phi, torch.tensor([[1.0], [1.082682], [1.120422]]))


def test_vespo_by_hand():
    # l = -phi A logp:  seq 1: [1, 2];  seq 2: -1.082682 x -1 x -0.5 = -0.541341;  seq 3: -1.120422 x 0.5 x
    # [-1, -3] = [0.560211, 1.680633]; sum 4.699503 over 5 tokens (dapo, num_items_in_batch 5) = 0.939901
    logprobs = VESPO_LOGP.clone().requires_grad_(True)
    old = VESPO_LOGP - VESPO_LOG_RATIO
    spec = loss_spec(loss_type="vespo")
    loss, metrics = policy_loss(logprobs, old, VESPO_ADVANTAGES, VESPO_MASK, spec, num_items_in_batch=5)
    assert loss.item() == pytest.approx(0.939901, abs=1e-5)
    assert metrics["vespo/phi_seq_mean"] == pytest.approx((1 + 1.082682 + 1.120422) / 3, abs=1e-6)
    loss.backward()  # phi carries no gradient: -phi A / 5 on every token of a sequence
    expected = torch.tensor([[-0.2, -0.2], [0.2165365, 0.0], [-0.1120422, -0.1120422]])
    torch.testing.assert_close(logprobs.grad, expected)


def test_vespo_takes_the_sampler_weights_into_w_and_not_onto_the_tokens():
    # one token, on-policy (logp = old = -1), A = 1; the sampler's log-prob ln 0.5 below -> truncated weight
    # exp(-1 - (-1 - ln2)) = 2 (cap 3). w = 1 x 2, phi = 2^2 e^(3 (1 - 2)) = 4 e^-3 = 0.199148;
    # l = -phi A logp = 0.199148 (not times 2); dapo over 1 token
    logprobs = torch.tensor([[-1.0]])
    sampling = torch.tensor([[-1.0 - LN2]])
    spec = loss_spec(loss_type="vespo")
    loss, metrics = policy_loss(logprobs, None, torch.ones(1), torch.ones(1, 1), spec, sampling_logprobs=sampling)
    assert loss.item() == pytest.approx(4 * math.exp(-3), abs=1e-6)
    assert metrics["sampling_is/weight_mean"] == pytest.approx(2.0)
    # the other losses multiply their per-token term by it: dapo on-policy -A = -1, times 2
    loss = policy_loss(logprobs, None, torch.ones(1), torch.ones(1, 1), loss_spec(), sampling_logprobs=sampling)[0]
    assert loss.item() == pytest.approx(-2.0)


def test_vespo_clamps_keep_phi_finite():
    # log w = 40 x 1 -> clamped to 20 (w = e^20): log phi = 3 + 2 x 20 - 3 e^20 -> phi = 0, not NaN;
    # log w = -40 -> clamped to ln 1e-8: phi = 1e-16 e^(3 (1 - 1e-8)) ~ 2.0e-15
    log_ratio = torch.tensor([[40.0], [-40.0]])
    phi = gamma_weights(log_ratio, torch.ones(2, 1), torch.ones(2, 1), loss_spec(loss_type="vespo"))
    assert phi[0, 0].item() == 0.0
    assert phi[1, 0].item() == pytest.approx(1e-16 * math.exp(3), rel=1e-4)


# --- two-sided clipping (delta) --------------------------------------------------------------------


def test_delta_caps_the_unclipped_ratio():
    # one token, r = 3, A = -1, epsilon 0.2: -min(3 x -1, 1.2 x -1) = 3; with delta = 2: -min(2 x -1, -1.2) = 2,
    # and no gradient (the capped ratio is constant)
    logprobs = torch.tensor([[math.log(3.0)]], requires_grad=True)
    old, mask, advantages = torch.zeros(1, 1), torch.ones(1, 1), -torch.ones(1)
    assert policy_loss(logprobs, old, advantages, mask, loss_spec(loss_type="bnpo"))[0].item() == pytest.approx(3.0)
    loss = policy_loss(logprobs, old, advantages, mask, loss_spec(loss_type="bnpo", delta=2.0))[0]
    assert loss.item() == pytest.approx(2.0)
    loss.backward()
    assert logprobs.grad.item() == 0.0


# --- the masks -------------------------------------------------------------------------------------


def test_off_policy_mask_by_hand():
    # mean log(old / pi) per sequence: seq 1 -(0 + ln1.5 + ln0.5) / 3 = 0.095894 (A > 0: kept anyway);
    # seq 2 -(ln1.1 + ln0.7) / 2 = 0.130682 with A < 0: dropped at threshold 0.1, kept at 0.2
    logprobs, old = _logprobs()
    keep = off_policy_sequence_mask(ADVANTAGES, logprobs, old, MASK, 0.1)
    torch.testing.assert_close(keep, torch.tensor([[1.0], [0.0]]))
    torch.testing.assert_close(off_policy_sequence_mask(ADVANTAGES, logprobs, old, MASK, 0.2), torch.ones(2, 1))
    # in the loss (bnpo): seq 2's tokens leave the policy term, not the normaliser: (-1 - 1.2 - 0.5) / 5 = -0.54
    spec = loss_spec(loss_type="bnpo", off_policy_mask_threshold=0.1)
    loss, metrics = policy_loss(logprobs, old, ADVANTAGES, MASK, spec)
    assert loss.item() == pytest.approx(-0.54, abs=1e-6)
    assert metrics["off_policy_mask/dropped_fraction"] == pytest.approx(0.5)
    # a sampling log-prob the sampler did not report (NaN) counts as no drift: seq 2 -> (0 - ln0.7) / 2 = 0.178337
    sampling = torch.tensor([[0.0, 0.0, 0.0], [float("nan"), 0.0, 0.0]])
    torch.testing.assert_close(
        off_policy_sequence_mask(ADVANTAGES[:, None], logprobs, sampling, MASK, 0.15), torch.tensor([[1.0], [0.0]])
    )


def test_off_policy_mask_measures_drift_from_the_sampler_when_given():
    # on-policy (old = logp) but the sampler's log-probs are 1 above the policy's: drift 1 > 0.5, so seq 2 (A < 0)
    # is dropped
    logprobs = torch.zeros(2, 3)
    sampling = torch.ones(2, 3)
    spec = loss_spec(loss_type="bnpo", off_policy_mask_threshold=0.5)
    _, metrics = policy_loss(logprobs, None, ADVANTAGES, MASK, spec, sampling_logprobs=sampling)
    assert metrics["off_policy_mask/dropped_fraction"] == pytest.approx(0.5)
    _, metrics = policy_loss(logprobs, None, ADVANTAGES, MASK, spec)  # no sampler: the drift from old = logp is 0
    assert metrics["off_policy_mask/dropped_fraction"] == 0.0


def test_token_mask_leaves_tokens_out_of_the_policy_term_only():
    # keep seq 1 tokens 0, 2 and seq 2 token 1: (-1 - 0.5 + 0.8) / 5 = -0.14 (bnpo still divides by 5 tokens);
    # the KL term (beta 0.1, ref = logp - ln2 on every token: k3 = e^-ln2 + ln2 - 1 = 0.193147) covers all 5
    logprobs, old = _logprobs()
    keep = torch.tensor([[1.0, 0.0, 1.0], [0.0, 1.0, 0.0]])
    spec = loss_spec(loss_type="bnpo", beta=0.1)
    ref = logprobs.detach() - LN2
    loss, metrics = policy_loss(logprobs, old, ADVANTAGES, MASK, spec, ref_logprobs=ref, token_mask=keep)
    assert metrics["policy_loss"] == pytest.approx(-0.14, abs=1e-6)
    assert loss.item() == pytest.approx(-0.14 + 0.1 * 0.193147, abs=1e-6)


def test_high_entropy_mask_by_hand():
    # masked entropies 0.1 0.4 0.2 | 0.3 0.5 (9.0 is padding), sorted 0.1 0.2 0.3 0.4 0.5
    entropies = torch.tensor([[0.1, 0.4, 0.2], [0.3, 0.5, 9.0]])
    mask = MASK.long()
    # threshold 0.5: rank 0.5 x 4 = 2 -> 0.3; kept: >= 0.3
    torch.testing.assert_close(
        high_entropy_mask(entropies, mask, 0.5), torch.tensor([[False, True, False], [True, True, False]])
    )
    # 0.8 (top 20 %): rank 3.2 -> 0.4 + 0.2 x (0.5 - 0.4) = 0.42: only 0.5
    torch.testing.assert_close(
        high_entropy_mask(entropies, mask, 0.8), torch.tensor([[False, False, False], [False, True, False]])
    )
    assert high_entropy_mask(entropies, mask, 0.0).tolist() == MASK.bool().tolist()  # every real token
    assert high_entropy_mask(entropies, torch.zeros(2, 3), 0.5).sum() == 0  # no real token: none
    # every process's tokens set the quantile: five more at 10.0 -> rank 4.5 of 10 -> lerp(0.5, 10, 0.5) = 5.25
    gather = lambda local: torch.cat([local, torch.full((5,), 10.0)])
    assert high_entropy_mask(entropies, mask, 0.5, gather).sum() == 0


@pytest.mark.parametrize("n", [1, 2, 7, 1000])
def test_quantile_equals_torch_quantile(n):
    values = torch.rand(n, generator=torch.Generator().manual_seed(n))
    for q in (0.0, 0.2, 0.5, 0.8, 0.999, 1.0):
        assert torch.equal(quantile(values, q), torch.quantile(values, q))
