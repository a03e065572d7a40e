"""algos.chunk_share: a chunk's weight in its whole's aggregate, by hand and for random splits."""

from __future__ import annotations

import itertools

import pytest
import torch

from grpokit.algos.masked import aggregate, chunk_share
from grpokit.algos.names import AGGREGATIONS

# Three completions, chunks = rows {0, 1} and {2}:
#   values [[1, 2, 0], [3, 0, 0], [4, 5, 6]], mask [[1, 1, 0], [1, 0, 0], [1, 1, 1]]
VALUES = torch.tensor([[1.0, 2.0, 0.0], [3.0, 0.0, 0.0], [4.0, 5.0, 6.0]])
MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
KEYWORDS = {"max_completion_length": 4, "num_items_in_batch": 12}

# By hand, (chunk A's aggregate, its share, chunk B's aggregate, its share, the whole's aggregate):
#   grpo: sequence means 1.5, 3, 5: A (1.5 + 3) / 2 = 2.25 x 2/3, B 5 x 1/3; whole 9.5 / 3
#   bnpo: A 6 / 3 tokens = 2 x 3/6, B 15 / 3 = 5 x 3/6; whole 21 / 6 = 3.5
#   dapo (12 tokens in the generation batch): A 6 / 12 x 1, B 15 / 12 x 1; whole 21 / 12 = 1.75
#   dr_grpo (max_completion_length 4): A 6 / (2 x 4) = 0.75 x 2/3, B 15 / 4 = 3.75 x 1/3; whole 21 / 12 = 1.75
#   luspo: sequence sums 3, 3, 15: A 6 / 2 = 3 x 2/3, B 15 x 1/3; whole 21 / 3 = 7
BY_HAND = {
    "grpo": (2.25, 2 / 3, 5.0, 1 / 3, 9.5 / 3),
    "bnpo": (2.0, 0.5, 5.0, 0.5, 3.5),
    "dapo": (0.5, 1.0, 1.25, 1.0, 1.75),
    "dr_grpo": (0.75, 2 / 3, 3.75, 1 / 3, 1.75),
    "luspo": (3.0, 2 / 3, 15.0, 1 / 3, 7.0),
}


@pytest.mark.parametrize("mode", AGGREGATIONS)
def test_chunk_share_by_hand(mode):
    a, share_a, b, share_b, whole = BY_HAND[mode]
    parts = [(slice(0, 2), a, share_a), (slice(2, 3), b, share_b)]
    for rows, value, share in parts:
        assert aggregate(VALUES[rows], MASK[rows], mode, **KEYWORDS).item() == pytest.approx(value)
        assert chunk_share(mode, MASK[rows], MASK, num_items_in_batch=12) == pytest.approx(share)
    assert aggregate(VALUES, MASK, mode, **KEYWORDS).item() == pytest.approx(whole)
    assert a * share_a + b * share_b == pytest.approx(whole)


@pytest.mark.parametrize("mode", AGGREGATIONS)
@pytest.mark.parametrize("items", [None, 37.0])
def test_chunk_shares_add_up_to_the_whole(mode, items):
    """Any split into chunks (an all-padding row and an empty chunk's tokens included) gives the whole's value."""
    generator = torch.Generator().manual_seed(0)
    values = torch.randn(7, 5, generator=generator)
    mask = (torch.rand(7, 5, generator=generator) > 0.4).float()
    mask[3] = 0.0
    keywords = {"max_completion_length": 5, "num_items_in_batch": items}
    whole = aggregate(values, mask, mode, **keywords)
    for cuts in ([0, 3, 7], [0, 1, 4, 7], [0, 2, 3, 4, 7]):
        total = sum(
            chunk_share(mode, mask[a:b], mask, num_items_in_batch=items)
            * aggregate(values[a:b], mask[a:b], mode, **keywords)
            for a, b in itertools.pairwise(cuts)
        )
        torch.testing.assert_close(total, whole, rtol=1e-6, atol=1e-7)


def test_chunk_share_refuses_an_unknown_aggregation():
    with pytest.raises(ValueError, match="unknown aggregation 'mean'"):
        chunk_share("mean", MASK, MASK)
