import math

import pytest

from grpokit.algos import pass_at_k


def test_edge_cases():
    assert pass_at_k(10, 0, 3) == 0.0  # no correct sample
    assert pass_at_k(10, 10, 3) == 1.0  # all correct
    assert pass_at_k(10, 8, 3) == 1.0  # n - c = 2 < k = 3: every draw of 3 has a correct one
    assert pass_at_k(1, 1, 1) == 1.0


def test_by_hand():
    # n=5, c=2, k=2: 1 - C(3,2)/C(5,2) = 1 - 3/10 = 0.7 (product form: 1 - (1 - 2/4)(1 - 2/5))
    assert pass_at_k(5, 2, 2) == pytest.approx(0.7)
    # k = 1 is the fraction correct: 3/8
    assert pass_at_k(8, 3, 1) == pytest.approx(0.375)


def test_matches_binomial_form_and_is_stable_for_large_n():
    for n, c, k in [(20, 3, 5), (50, 10, 10), (100, 1, 1), (30, 0, 7)]:
        assert pass_at_k(n, c, k) == pytest.approx(1 - math.comb(n - c, k) / math.comb(n, k))
    # C(2000, 1000) overflows a float; the product form does not
    assert pass_at_k(2000, 1, 1000) == pytest.approx(0.5)


@pytest.mark.parametrize("n,c,k", [(5, 6, 1), (5, -1, 1), (5, 2, 0), (5, 2, 6)])
def test_invalid(n, c, k):
    with pytest.raises(ValueError):
        pass_at_k(n, c, k)
