"""The update's mean metrics over the global batch (grpokit/train/learning/batch_means.py), by hand."""

import pytest
import torch

from grpokit.algos.names import CLIP_REGION, IS_WEIGHT_MAX, KL, RATIO_MEAN
from grpokit.system.processes import SingleProcess
from grpokit.train.learning.batch_means import global_means, part_sums


class TwoRanks:
    """This rank's all-reduce with another rank's fixed contribution added (what torch.distributed's sum gives)."""

    def __init__(self, other):
        self.other = other

    def sum(self, value: torch.Tensor) -> torch.Tensor:
        return value + self.other


def test_token_means_are_weighted_by_tokens_over_micro_batches_and_ranks():
    # This rank: micro-batches of 3 and 1 tokens, kl 0.2 and 0.6 -> sum 0.2*3 + 0.6*1 = 1.2 over 4 tokens.
    # The other rank: one micro-batch of 6 tokens, kl 0.1 -> 0.6 over 6. Global: 1.8 / 10 = 0.18 (a mean of the
    # ranks' means would be (0.3 + 0.1) / 2 = 0.2).
    parts = [{KL: 0.2, CLIP_REGION: 0.5}, {KL: 0.6, CLIP_REGION: 0.0}]
    mine = part_sums(parts, tokens=[3.0, 1.0], sequences=[2.0, 2.0], level="token")
    assert mine[KL] == pytest.approx((1.2, 4.0, 2.0))
    assert mine[CLIP_REGION] == pytest.approx((1.5, 4.0, 2.0))  # 0.5*3 + 0*1
    assert mine[RATIO_MEAN] == (0, 0, 0.0)  # every key, reported or not: both ranks reduce the same vector
    keys = sorted(mine)
    other = part_sums([{KL: 0.1, CLIP_REGION: 0.25}], tokens=[6.0], sequences=[2.0], level="token")
    means = global_means(mine, TwoRanks(torch.tensor([other[k] for k in keys], dtype=torch.float64)))
    assert means[KL] == pytest.approx(0.18)
    assert means[CLIP_REGION] == pytest.approx((1.5 + 0.25 * 6) / 10)  # 0.3
    assert RATIO_MEAN not in means  # no micro-batch of either rank reported it
    assert IS_WEIGHT_MAX not in mine  # a maximum is not a mean: the learner averages it as before


def test_level_means_count_sequences_at_sequence_level():
    # Clipped fractions at sequence level are fractions of sequences: micro-batches of 2 and 4 sequences (3 and 9
    # tokens), clipped 0.5 and 0.25 -> (0.5*2 + 0.25*4) / 6 = 2/6; kl stays a token mean: (0.1*3 + 0.3*9) / 12 = 0.25.
    parts = [{KL: 0.1, CLIP_REGION: 0.5}, {KL: 0.3, CLIP_REGION: 0.25}]
    means = global_means(part_sums(parts, [3.0, 9.0], [2.0, 4.0], "sequence"), SingleProcess())
    assert means[CLIP_REGION] == pytest.approx(2 / 6)
    assert means[KL] == pytest.approx(0.25)


def test_extra_sums_and_an_empty_batch():
    # The learner adds the entropy as (sum over its tokens, token count, 1): 2.0 over 8 tokens -> 0.25. A key
    # reported over zero tokens is 0, not a division by zero.
    sums = part_sums([{KL: 0.0}], [0.0], [1.0], "token") | {"entropy": (2.0, 8.0, 1.0)}
    means = global_means(sums, SingleProcess())
    assert means == {KL: 0.0, "entropy": 0.25}
