"""grpokit.data.smiles: the plain Python SMILES tokenizer and the MOSES sample metrics."""

from __future__ import annotations

import math

import pytest

from grpokit.data.smiles import (
    SmilesTokenizer,
    canonical_set,
    molecule_metrics,
    read_smiles,
)


def test_tokenizer_round_trip_specials_and_save(tmp_path):
    tokenizer = SmilesTokenizer.from_smiles(["CCO", "c1ccccc1Cl"])
    # ids 0-2 are pad " ", bos "^", eos "$"; then the sorted characters: 1 C O c l
    assert tokenizer.vocab == [" ", "^", "$", "1", "C", "O", "c", "l"]
    assert (tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id) == (0, 1, 2)
    assert tokenizer.encode("^CCO$") == [1, 4, 4, 5, 2]
    assert tokenizer.decode([1, 4, 4, 5, 2, 0]) == "CCO"
    assert tokenizer.decode([1, 4, 2], skip_special_tokens=False) == "^C$"
    with pytest.raises(ValueError, match="'N' is not in the SMILES vocabulary"):
        tokenizer.encode("CN")
    tokenizer.save_pretrained(tmp_path)
    assert SmilesTokenizer.from_pretrained(tmp_path).vocab == tokenizer.vocab


def test_read_smiles_takes_the_first_field(tmp_path):
    path = tmp_path / "m.smi"
    path.write_text("CCO ethanol\n\nc1ccccc1\n")
    assert read_smiles(path) == ["CCO", "c1ccccc1"]


def test_molecule_metrics_by_hand():
    pytest.importorskip("rdkit")
    from rdkit import Chem
    from rdkit.Chem import QED

    from grpokit.system.molecules import sascorer as _sascorer

    generated = ["CCO", "OCC", "C1CC", "", "c1ccccc1"]
    metrics = molecule_metrics(generated, canonical_set(["CCO", "not a molecule"]))
    # valid: CCO, OCC (both ethanol), c1ccccc1 -> 3 of 5; "C1CC" leaves a ring open, "" is empty
    assert metrics["validity"] == pytest.approx(3 / 5)
    # distinct canonical forms: CCO and c1ccccc1 -> 2 of 3 valid
    assert metrics["uniqueness"] == pytest.approx(2 / 3)
    # ethanol is in the training set, benzene is not -> 1 of 2
    assert metrics["novelty"] == pytest.approx(1 / 2)
    ethanol, benzene = Chem.MolFromSmiles("CCO"), Chem.MolFromSmiles("c1ccccc1")
    assert metrics["qed"] == pytest.approx((2 * QED.qed(ethanol) + QED.qed(benzene)) / 3)
    sa = _sascorer().calculateScore
    assert metrics["sa"] == pytest.approx((2 * sa(ethanol) + sa(benzene)) / 3)


def test_molecule_metrics_without_valid_molecules():
    pytest.importorskip("rdkit")
    metrics = molecule_metrics(["C1CC", "(("], set())
    assert metrics["validity"] == metrics["uniqueness"] == metrics["novelty"] == 0.0
    assert math.isnan(metrics["qed"]) and math.isnan(metrics["sa"])
