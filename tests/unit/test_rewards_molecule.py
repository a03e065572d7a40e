"""The ``molecule`` reward (RDKit)."""

import sys

import pytest

pytest.importorskip("rdkit")

from grpokit.rewards import get_reward

VALID = ["c1ccccc1", "CCO", " CC(=O)Oc1ccccc1C(=O)O \n", "C"]  # benzene, ethanol, aspirin, methane
INVALID = [
    "C1CC",
    "Xx",
    "c1cccc1",
    "",
    "   ",
    "CC(C",
]  # open ring, junk, bad aromatic, empty, paren


def test_validity():
    fn = get_reward("molecule")
    assert fn([""] * len(VALID), VALID) == [1.0] * len(VALID)
    assert fn([""] * len(INVALID), INVALID) == [0.0] * len(INVALID)


def test_invalid_value_applies_to_every_metric():
    for metric in ("validity", "qed", "sa"):
        assert get_reward("molecule", metric=metric, invalid_value=-1.0)([""], ["C1CC"]) == [-1.0]


def test_qed_in_unit_interval_and_deterministic():
    fn = get_reward("molecule", metric="qed")
    scores = fn([""] * len(VALID), VALID)
    assert all(0.0 < s < 1.0 for s in scores)
    assert fn([""] * len(VALID), VALID) == scores
    # Stripping: the same molecule with and without surrounding whitespace scores the same.
    assert fn(["", ""], ["CCO", "  CCO\n"]) == [scores[1], scores[1]]


def test_sa_normalised():
    fn = get_reward("molecule", metric="sa")
    # sascorer clamps its score to [1, 10]; benzene is as easy as it gets: sa = 1 -> (10 - 1)/9 = 1.
    assert fn([""], ["c1ccccc1"]) == [pytest.approx(1.0)]
    scores = fn([""] * len(VALID), VALID)
    assert all(0.0 <= s <= 1.0 for s in scores)
    # Erythromycin (a macrolide with 18 stereocentres) is far harder to make than aspirin.
    erythromycin = (
        "CC[C@@H]1[C@@]([C@@H]([C@H](C(=O)[C@@H](C[C@@]([C@@H]([C@H]([C@@H]([C@H](C(=O)O1)C)"
        "O[C@H]2C[C@@]([C@H]([C@@H](O2)C)O)(C)OC)C)O[C@H]3[C@@H]([C@H](C[C@H](O3)C)N(C)C)O)"
        "(C)O)C)C)O)(C)O"
    )
    assert fn([""], [erythromycin])[0] < scores[2]


def test_invalid_smiles_do_not_log(capfd):
    get_reward("molecule")([""], ["C1CC"])
    assert "SMILES Parse Error" not in capfd.readouterr().err


def test_unknown_metric():
    with pytest.raises(ValueError, match="metric"):
        get_reward("molecule", metric="logp")


def test_missing_rdkit_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "rdkit", None)  # makes `import rdkit` raise ImportError
    with pytest.raises(ImportError, match=r"grpokit\[chem\]"):
        get_reward("molecule")
