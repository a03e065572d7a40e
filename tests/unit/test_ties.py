"""TieWatch: the warning when every group ties for warn_tied_steps steps in a row (grpokit/train/ties.py)."""

import math

import torch

from grpokit.train.ties import TieWatch

NAN = math.nan


def rewards(*rows):
    """per_func [N, 2] of the functions (accuracy, format) and their sum as the combined reward [N]."""
    per_func = torch.tensor(rows, dtype=torch.float64)
    return per_func, per_func.nan_to_num().sum(dim=1)


NAMES = ["accuracy", "format"]
# G = 2, two groups: (rows 0, 1) and (rows 2, 3)
TIED = rewards([0, 1], [0, 1], [1, 0.5], [1, 0.5])  # group 1: 1 and 1; group 2: 1.5 and 1.5
TIED_AGAIN = rewards([0, 1], [0, 1], [0, NAN], [0, NAN])  # 1 and 1; 0 and 0 (format gave None)
INFORMATIVE = rewards([1, 1], [0, 1], [0, 1], [0, 1])  # group 1: 2 vs 1


def test_warns_on_the_limit_th_tied_step_naming_each_function_and_its_values():
    watch = TieWatch(limit=2, num_generations=2)
    assert watch.step(1, NAMES, *TIED) is None
    warning = watch.step(2, NAMES, *TIED_AGAIN)
    # values over steps 1-2: accuracy gave 0 and 1; format gave 1, 0.5 and (step 2, group 2) None
    assert warning == (
        "steps 1-2: in every group all 2 completions got the same reward, so the advantages were 0 and nothing was "
        "learned from the rewards (accuracy gave 0 or 1; format gave 0.5 or 1 or no value (None)). Check that the "
        "reward functions can tell completions apart on this data and model (its column, its format); "
        "warn_tied_steps: 0 turns this warning off."
    )
    assert watch.step(3, NAMES, *TIED) is None  # once per streak


def test_an_informative_step_ends_the_streak():
    watch = TieWatch(limit=2, num_generations=2)
    assert watch.step(1, NAMES, *TIED) is None
    assert watch.step(2, NAMES, *INFORMATIVE) is None
    assert watch.step(3, NAMES, *TIED) is None
    assert watch.step(4, NAMES, *TIED).startswith("steps 3-4: ")


def test_many_values_are_summarised_as_a_range():
    per_func = torch.tensor([[v] for v in (0.1, 0.1, 0.2, 0.2, 0.3, 0.3, 0.4, 0.4, 0.5, 0.5)], dtype=torch.float64)
    warning = TieWatch(limit=1, num_generations=2).step(7, ["length"], per_func, per_func[:, 0])
    assert "(length gave 5 values from 0.1 to 0.5)" in warning and warning.startswith("steps 7-7: ")


def test_off_for_zero_for_groups_of_one_and_for_a_learned_baseline():
    for watch in (
        TieWatch(limit=0, num_generations=2),
        TieWatch(limit=1, num_generations=1),
        TieWatch(limit=1, num_generations=2, group_relative=False),
    ):
        assert all(watch.step(s, NAMES, *TIED) is None for s in range(1, 5))
