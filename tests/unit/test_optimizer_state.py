"""AdamW's state made before the first step (``allocate_state``, for the policy and PPO's critic): the
same steps and the same state as torch's lazy initialisation, fused or not, with amsgrad or not; a parameter that
already has state keeps it."""

import copy

import pytest
import torch

from grpokit.train.learning.optimizer import allocate_state


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("amsgrad", [False, True])
def test_the_same_steps_and_state_as_lazy_initialisation(fused, amsgrad):
    torch.manual_seed(0)
    lazy_model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 2))
    early_model = copy.deepcopy(lazy_model)
    hyper = dict(lr=0.1, weight_decay=0.01, fused=fused, amsgrad=amsgrad)
    lazy = torch.optim.AdamW(lazy_model.parameters(), **hyper)
    early = allocate_state(torch.optim.AdamW(early_model.parameters(), **hyper))
    assert len(early.state) == 4 and not lazy.state  # made before any step
    assert all(float(s["step"]) == 0 and not s["exp_avg"].any() for s in early.state.values())
    for _ in range(3):
        x = torch.randn(4, 8)
        for model, optimizer in ((lazy_model, lazy), (early_model, early)):
            optimizer.zero_grad()
            model(x).pow(2).sum().backward()
            optimizer.step()
    for a, b in zip(lazy_model.parameters(), early_model.parameters()):
        assert torch.equal(a, b)
    lazy_state, early_state = lazy.state_dict()["state"], early.state_dict()["state"]
    assert lazy_state.keys() == early_state.keys()
    for index, state in lazy_state.items():
        assert state.keys() == early_state[index].keys()
        for name, value in state.items():
            other = early_state[index][name]
            assert (other.dtype, other.device, other.shape) == (value.dtype, value.device, value.shape), name
            assert torch.equal(other, value), name


def test_existing_state_is_kept():
    weight = torch.nn.Parameter(torch.ones(3))
    optimizer = torch.optim.AdamW([weight], lr=0.1)
    weight.grad = torch.ones(3)
    optimizer.step()
    before = {k: v.clone() for k, v in optimizer.state[weight].items()}
    allocate_state(optimizer)
    assert all(torch.equal(optimizer.state[weight][k], v) for k, v in before.items())
