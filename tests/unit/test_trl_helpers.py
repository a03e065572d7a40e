"""TRL's GRPOTrainer helpers on grpokit's GRPOTrainer (get_high_entropy_mask, get_off_policy_mask) and
``trainer.accelerator``, the accelerate-like view of grpokit's processes they read."""

from __future__ import annotations

from unittest.mock import Mock

import torch

from grpokit.system.processes import SingleProcess
from grpokit.train.learning.accelerator import ProcessAccelerator, gather_ragged
from grpokit.trl.trainer import GRPOTrainer

ENTROPIES = torch.tensor([[0.1, 0.4, 0.2], [0.3, 0.5, 9.0]])
MASK = torch.tensor([[1, 1, 1], [1, 1, 0]])


def _mock_trainer(other_process: torch.Tensor | None = None):
    """A Mock(spec=GRPOTrainer) with only an accelerator, as TRL's tests build one; ``other_process``: the masked
    entropies of a second process, padded and gathered as accelerate would."""
    trainer = Mock(spec=GRPOTrainer)
    trainer.accelerator = Mock()
    if other_process is None:
        trainer.accelerator.pad_across_processes = lambda x, dim, pad_index: x
        trainer.accelerator.gather = lambda x: x
    else:
        longest = max(5, other_process.numel())

        def pad(x, dim, pad_index):
            return torch.cat([x, torch.full((longest - x.numel(),), pad_index)])

        trainer.accelerator.pad_across_processes = pad
        trainer.accelerator.gather = lambda x: torch.cat([x, pad(other_process, 0, -1e9)])
    return trainer


def test_get_high_entropy_mask_reads_only_the_accelerator():
    # masked entropies sorted 0.1 0.2 0.3 0.4 0.5; threshold 0.5 -> the 0.5-quantile 0.3; kept: >= 0.3
    mask = GRPOTrainer.get_high_entropy_mask(_mock_trainer(), ENTROPIES, MASK, 0.5)
    assert mask.tolist() == [[False, True, False], [True, True, False]]
    # threshold 1.0: only the highest real token (9.0 is padding)
    mask = GRPOTrainer.get_high_entropy_mask(_mock_trainer(), ENTROPIES, MASK, 1.0)
    assert mask.tolist() == [[False, False, False], [False, True, False]]


def test_get_high_entropy_mask_takes_the_quantile_over_every_process():
    # a second process with 7 tokens at 2.0: 12 values 0.1 .. 0.5, 2.0 x 7; threshold 0.5: rank 5.5 -> 2.0, so
    # none of this process's tokens is kept; the padding (-1e9) of the shorter process is not a value
    trainer = _mock_trainer(torch.full((7,), 2.0))
    assert GRPOTrainer.get_high_entropy_mask(trainer, ENTROPIES, MASK, 0.5).sum() == 0
    # threshold 0.2: rank 2.2 -> 0.3 + 0.2 x 0.1 = 0.32: 0.4 and 0.5 kept
    mask = GRPOTrainer.get_high_entropy_mask(trainer, ENTROPIES, MASK, 0.2)
    assert mask.tolist() == [[False, True, False], [False, True, False]]


def test_get_off_policy_mask_is_a_static_helper():
    # mean log(mu / pi) per sequence: [2, 0.5, 2]; advantages [1, -1, -1]; threshold 1: keep, keep, drop
    logps = torch.tensor([[-2.0, -2.0], [-0.5, -0.5], [-2.0, -2.0]])
    keep = GRPOTrainer.get_off_policy_mask(
        torch.tensor([[1.0], [-1.0], [-1.0]]), logps, torch.zeros(3, 2), 1.0 * torch.ones(3, 2), 1.0
    )
    assert keep.tolist() == [[1.0], [1.0], [0.0]]


def test_accelerator_of_one_process():
    accelerator = ProcessAccelerator(SingleProcess(), torch.device("cpu"))
    assert (accelerator.num_processes, accelerator.process_index, accelerator.is_main_process) == (1, 0, True)
    values = torch.tensor([1.0, 2.0])
    assert torch.equal(accelerator.gather(values), values)
    assert accelerator.gather(torch.tensor(3.0)).tolist() == [3.0]  # a scalar gathers to [1], as accelerate's
    assert torch.equal(accelerator.pad_across_processes(values, dim=0, pad_index=-1), values)
    assert accelerator.reduce(torch.tensor(4.0), "mean").item() == 4.0


class _TwoProcesses(SingleProcess):
    """Rank 0 of 2; rank 1 holds ``other``: gather returns rank 0's tensor then rank 1's of the same shape."""

    def __init__(self, other: torch.Tensor):
        super().__init__(rank=0, world_size=2)
        self.other = other

    def gather(self, tensor):
        if tensor.dtype == torch.long and tensor.numel() == 1:  # a size
            return torch.cat([tensor, torch.tensor([self.other.numel()])])
        theirs = torch.zeros_like(tensor)
        theirs[: self.other.numel()] = self.other
        return torch.cat([tensor, theirs])

    def sum(self, value):
        return value * 2


def test_ragged_gather_and_padding_over_two_processes():
    procs = _TwoProcesses(torch.tensor([7.0, 8.0, 9.0]))
    assert gather_ragged(procs, torch.tensor([1.0])).tolist() == [1.0, 7.0, 8.0, 9.0]
    assert gather_ragged(procs, torch.tensor([1.0, 2.0, 3.0, 4.0])).tolist() == [1.0, 2.0, 3.0, 4.0, 7.0, 8.0, 9.0]
    accelerator = ProcessAccelerator(procs, torch.device("cpu"))
    assert accelerator.pad_across_processes(torch.tensor([1.0]), pad_index=-1).tolist() == [1.0, -1.0, -1.0]
    assert accelerator.reduce(torch.tensor(3.0)).item() == 6.0
