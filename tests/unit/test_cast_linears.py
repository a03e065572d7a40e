"""Cast-once Linears (kernels/cast_linears.py): the policy's log-probs and gradients those of plain autocast (log-probs
bitwise, gradients within bf16 rounding), a no-op in float32, never a stale cast (after an optimizer step, an in-place
update, load_state_dict), one cast per weight and optimizer step in Learner.update, LoRA and frozen layers."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
from shared_helpers import tiny_args

from grpokit.compose.specs import learner_spec
from grpokit.kernels import Kernels
from grpokit.kernels.cast_linears import CastLinear, LinearCasts, cast_linears
from grpokit.testing import build_tiny_causal_lm, build_word_tokenizer
from grpokit.train.learning.learner import Learner
from grpokit.train.learning.policy_logprobs import Batch, completion_logprobs

pytestmark = pytest.mark.usefixtures("one_thread")
CPU = torch.device("cpu")
BF16 = torch.bfloat16
CASTS = 2 * (7 + 3) + 1  # casts of one pass of the tiny model: 7 weights and 3 biases per layer, the head's weight


@pytest.fixture(scope="module")
def tiny():
    """A tiny Qwen2 (q/k/v biases, 2 layers, hidden 64) and a batch of 2 prompts x 2 completions of 6 tokens."""
    tokenizer = build_word_tokenizer([f"w{i}" for i in range(60)])
    model, _ = build_tiny_causal_lm(tokenizer=tokenizer, arch="qwen2", hidden_size=64, num_heads=4, num_kv_heads=2)
    g = torch.Generator().manual_seed(1)
    completions = torch.randint(5, 60, (4, 6), generator=g)
    mask = torch.ones(4, 6)
    mask[1, 4:] = 0
    prompts = torch.randint(5, 60, (2, 5), generator=g)
    batch = Batch(
        completions, mask, torch.tensor([0, 0, 1, 1]), prompt_ids=prompts, prompt_mask=torch.ones_like(prompts)
    )
    return model.train(), batch


def kernels(dtype=BF16):
    """The run's kernels with the cast-once Linears on (off by default until measured faster)."""
    return dataclasses.replace(Kernels.select(CPU, dtype), cast_once_linears=True)


def learner_pass(model, batch, ks, dtype=BF16, grad=True):
    """Log-probs [N, T] and the gradients of a GRPO-shaped loss (None: no gradient) under autocast of ``dtype``."""
    model.zero_grad(set_to_none=True)
    with torch.set_grad_enabled(grad), torch.autocast("cpu", dtype=dtype or BF16, enabled=dtype is not None):
        logprobs, _ = completion_logprobs(model, batch, 1.0, with_entropy=grad, kernels=ks)
    if not grad:
        return logprobs, None
    (logprobs.float() * torch.tensor([1.0, -0.5, 0.25, -1.0])[:, None] * batch.completion_mask).sum().backward()
    return logprobs.detach(), {n: p.grad.to_dense() for n, p in model.named_parameters() if p.grad is not None}


def assert_close_grads(grads, expected):
    assert grads.keys() == expected.keys()
    for name, g in grads.items():
        # bf16 rounding of the products, in another order for the bias sums: within 2 % of the largest entry
        assert torch.allclose(g, expected[name], rtol=0, atol=2e-2 * float(expected[name].abs().max())), name


def test_cast_linear_by_hand():
    # x [1, 2] = [1, 2], W [[1, 3]] (one output), b = 0.5: y = 1 + 6 + 0.5 = 7.5; with dy = 2:
    # dx = 2 W = [2, 6], dW = 2 x = [2, 4], db = 2 (all exact in bf16)
    x = torch.tensor([[1.0, 2.0]], requires_grad=True)
    w = torch.tensor([[1.0, 3.0]], requires_grad=True)
    b = torch.tensor([0.5], requires_grad=True)
    y = CastLinear.apply(x, w, b, w.detach().to(BF16), b.detach().to(BF16))
    assert y.dtype == BF16 and y.item() == 7.5
    (y.float() * 2).sum().backward()
    assert x.grad.tolist() == [[2.0, 6.0]] and w.grad.tolist() == [[2.0, 4.0]] and b.grad.tolist() == [2.0]
    assert x.grad.dtype == w.grad.dtype == b.grad.dtype == torch.float32  # to the float32 master weights


def test_logprobs_and_gradients_match_autocast(tiny):
    model, batch = tiny
    ks = kernels()
    expected_lp, expected = learner_pass(model, batch, ks)
    casts = ks.state.linear_casts
    with ks.cast_linears(model) as switched:
        assert switched == 2 * 7 + 1  # q k v o gate up down per layer, and the head (a Linear too)
        logprobs, grads = learner_pass(model, batch, ks)
        made = casts.made
        again, _ = learner_pass(model, batch, ks, grad=False)  # the old-policy pass: the same casts, none made
        assert casts.made == made
    assert torch.equal(logprobs, expected_lp) and torch.equal(again, expected_lp)
    assert_close_grads(grads, expected)
    assert len(casts) == 0  # dropped when the block ends


def test_float32_is_unchanged(tiny):
    model, batch = tiny
    ks = kernels(None)
    expected_lp, expected = learner_pass(model, batch, ks, dtype=None)
    with ks.cast_linears(model) as switched:  # no autocast dtype: a no-op
        assert switched is None
    with cast_linears(model, LinearCasts(), BF16):  # switched, but called without autocast: each layer's own
        logprobs, grads = learner_pass(model, batch, ks, dtype=None)
    assert torch.equal(logprobs, expected_lp)
    assert all(torch.equal(grads[n], expected[n]) for n in expected)


def test_in_place_update_is_never_served_stale(tiny):
    model, batch = tiny
    model = copy.deepcopy(model)
    ks = kernels()
    with ks.cast_linears(model):
        before, _ = learner_pass(model, batch, ks, grad=False)
        with torch.no_grad():  # the weights change in place, as an optimizer's step: their tensor version moves
            for p in model.parameters():
                p.mul_(1.5)
        after, _ = learner_pass(model, batch, ks, grad=False)
        other = copy.deepcopy(tiny[0].state_dict())
        model.load_state_dict(other)  # a resume's load: copy_ into the same tensors
        loaded, _ = learner_pass(model, batch, ks, grad=False)
    fresh, _ = learner_pass(model, batch, ks, grad=False)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1.5)
    fresh_scaled, _ = learner_pass(model, batch, ks, grad=False)
    assert torch.equal(loaded, fresh) and torch.equal(before, fresh)
    assert torch.equal(after, fresh_scaled) and not torch.equal(after, before)


class DataSGD(torch.optim.Optimizer):
    """SGD writing through ``p.data`` (as some optimizers do): the parameters' tensor versions do not move."""

    def __init__(self, params, lr):
        super().__init__(params, {"lr": lr})

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.data.add_(p.grad.to_dense(), alpha=-group["lr"])


def update_learner(model, ks, optimizer_cls, num_iterations=1, seed=0):
    cfg = tiny_args(num_generations=2, prompts_per_step=2, max_completion_length=6, beta=0.0, learning_rate=0.05)
    cfg.num_iterations = num_iterations
    optimizer = optimizer_cls(model.parameters(), lr=0.05)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    return Learner(model, None, optimizer, scheduler, learner_spec(cfg), autocast_dtype=BF16, kernels=ks)


def test_optimizer_step_drops_the_casts(tiny):
    """An optimizer that bypasses tensor versions: only the step hook keeps the next pass off the old casts."""
    model, batch = tiny
    model = copy.deepcopy(model)
    ks = kernels()
    learner = update_learner(model, ks, DataSGD)
    with ks.cast_linears(model):
        learner_pass(model, batch, ks)
        # each layer's 7 weights and 3 q/k/v biases, and the tied head's weight (the prompt pass's last position)
        assert len(ks.state.linear_casts) == CASTS
        learner.optimizer.step()
        assert len(ks.state.linear_casts) == 0
        after, _ = learner_pass(model, batch, ks, grad=False)
    fresh, _ = learner_pass(model, batch, ks, grad=False)
    assert torch.equal(after, fresh)


def test_update_casts_each_weight_once_per_step(tiny):
    model, batch = tiny
    advantages = torch.tensor([1.0, -1.0, 0.5, -0.5])
    results = {}
    for cast in (False, True):
        ks = dataclasses.replace(kernels(), cast_once_linears=cast, state=type(kernels().state)())
        policy = copy.deepcopy(model)
        learner = update_learner(policy, ks, torch.optim.SGD, num_iterations=2)  # steps linear in the gradients
        metrics = learner.update(batch, advantages, batch.completion_mask, None)
        results[cast] = (metrics, torch.cat([p.detach().flatten() for p in policy.parameters()]))
        # three passes (old policy, step 1, step 2): the old pass's casts serve step 1, step 2 casts again; so more
        # than one pass's casts and at most two passes' (the no-grad old pass may skip the head's prompt position)
        made = ks.state.linear_casts.made
        assert (CASTS < made <= 2 * CASTS) if cast else made == 0
    (plain, w_plain), (cast, w_cast) = results[False], results[True]
    assert abs(plain["loss"] - cast["loss"]) <= 1e-2 * max(1.0, abs(plain["loss"]))
    moved = (w_plain - torch.cat([p.detach().flatten() for p in model.parameters()])).norm()
    assert float((w_cast - w_plain).norm()) <= 0.02 * float(moved)  # the two steps agree within bf16 rounding


def test_lora_and_frozen_layers(tiny):
    peft = pytest.importorskip("peft")
    model, batch = tiny
    ks = kernels()
    lora = peft.get_peft_model(
        copy.deepcopy(model),
        peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False),
    )
    frozen = copy.deepcopy(model)
    frozen.model.layers[0].requires_grad_(False)  # a frozen layer among trainable ones
    for m in (lora, frozen):
        expected_lp, expected = learner_pass(m, batch, ks)
        with ks.cast_linears(m):
            logprobs, grads = learner_pass(m, batch, ks)
        assert torch.equal(logprobs, expected_lp)
        assert_close_grads(grads, expected)
    assert all("lora_" in n for n in expected_lora(lora, batch, ks))
    assert not any(n.startswith("model.layers.0.") for n in learner_pass(frozen, batch, ks)[1])


def expected_lora(model, batch, ks):
    with ks.cast_linears(model):
        return learner_pass(model, batch, ks)[1]


def test_packed_casts_for_no_grad_passes(tiny):
    """pack_linear_casts: the old-policy pass multiplies with packed casts (where oneDNN packs bf16 here; else the plain
    casts): bitwise autocast's log-probs (oneDNN's packed bf16 matmul is F.linear's), and kept across passes."""
    from grpokit.kernels.packed_linear import packing_available

    model, batch = tiny
    ks = dataclasses.replace(kernels(), pack_linear_casts=True)
    expected, _ = learner_pass(model, batch, ks, grad=False)
    with ks.cast_linears(model):
        first, _ = learner_pass(model, batch, ks, grad=False)
        made = ks.state.linear_casts.made
        second, _ = learner_pass(model, batch, ks, grad=False)
        assert ks.state.linear_casts.made == made
        packed = [entry[3] for entry in ks.state.linear_casts._casts.values()]
    assert torch.equal(first, expected) and torch.equal(second, expected)
    if packing_available(CPU, BF16):
        assert any(packed)  # the Linears' packed copies were made and used
