"""RDKit's reading of a SMILES string and its synthetic-accessibility scorer, shared by the molecule reward
(rewards/molecule.py) and the SMILES data's metrics (data/smiles.py). RDKit is the chem extra, imported when called."""

from __future__ import annotations

import os
import sys


def sascorer():
    """RDKit's Contrib ``sascorer`` module (Ertl & Schuffenhauer 2009), put on the path on first use."""
    from rdkit.Chem import RDConfig

    contrib = os.path.join(RDConfig.RDContribDir, "SA_Score")
    if contrib not in sys.path:
        sys.path.append(contrib)
    import sascorer as module

    return module


def parse_smiles(smiles: str):
    """The RDKit molecule for a SMILES string, or None when invalid or empty."""
    from rdkit import Chem
    from rdkit.rdBase import BlockLogs

    smiles = smiles.strip()
    if not smiles:
        return None
    # Invalid SMILES are the common case early in training: keep RDKit's parse errors off stderr.
    with BlockLogs():
        molecule = Chem.MolFromSmiles(smiles)
    if molecule is None or molecule.GetNumAtoms() == 0:
        return None
    return molecule
