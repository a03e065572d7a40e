"""LR schedules and the reference resync, against hand-computed values."""

import math

import torch

from grpokit.train.learning.optimizer import lr_lambda
from grpokit.train.learning.reference import Reference


def test_schedules_by_hand():
    # warmup 2 of 10 steps: factors 0/2, 1/2, then 1 (constant) or decay over the 8 remaining steps
    linear = lr_lambda("linear", 2, 10)
    assert [linear(s) for s in (0, 1, 2, 6, 10)] == [0.0, 0.5, 1.0, 0.5, 0.0]  # (10-6)/8 = 0.5
    cosine = lr_lambda("cosine", 2, 10)
    assert math.isclose(cosine(6), 0.5 * (1 + math.cos(math.pi * 0.5)))  # halfway: 0.5
    assert math.isclose(cosine(2), 1.0) and math.isclose(cosine(10), 0.0, abs_tol=1e-12)
    constant = lr_lambda("constant", 0, 10)
    assert constant(0) == constant(9) == 1.0


def test_reference_resync_mixes_weights():
    policy = torch.nn.Linear(1, 1, bias=False)
    with torch.no_grad():
        policy.weight.fill_(2.0)
    ref = Reference(policy, use_adapters=False)  # frozen copy: 2.0
    with torch.no_grad():
        policy.weight.fill_(4.0)
    ref.sync(alpha=0.6)  # 0.6 * 4 + 0.4 * 2 = 3.2
    assert torch.allclose(ref.model.weight, torch.tensor([[3.2]]))
    assert not ref.model.weight.requires_grad
