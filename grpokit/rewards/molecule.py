"""``molecule``: score SMILES completions with RDKit (``pip install grpokit[chem]``).

Metrics: ``validity`` (1.0 when RDKit parses a non-empty molecule), ``qed`` (quantitative
estimate of drug-likeness, Bickerton et al. 2012, already in [0, 1]) and ``sa`` (synthetic
accessibility, Ertl & Schuffenhauer 2009, from RDKit's Contrib ``sascorer``: a score in
[1, 10] where lower is easier, mapped to [0, 1] as (10 - sa) / 9 so that higher is better).
An invalid or empty SMILES gets ``invalid_value`` whatever the metric.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import Any

from grpokit.rewards.contract import texts_of
from grpokit.rewards.registry import BUILTINS

METRICS = ("validity", "qed", "sa")


def _require_rdkit() -> None:
    try:
        import rdkit  # noqa: F401
    except ImportError as exc:
        raise ImportError("the molecule reward needs RDKit: pip install grpokit[chem]") from exc


def _sascorer():
    from rdkit.Chem import RDConfig

    contrib = os.path.join(RDConfig.RDContribDir, "SA_Score")
    if contrib not in sys.path:
        sys.path.append(contrib)
    import sascorer

    return sascorer


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


@BUILTINS.register("molecule")
class MoleculeReward:
    """RDKit score of each completion read as one SMILES string (whitespace stripped)."""

    name = "molecule"

    def __init__(self, metric: str = "validity", invalid_value: float = 0.0):
        if metric not in METRICS:
            raise ValueError(f"molecule reward: metric must be one of {METRICS}, got {metric!r}")
        _require_rdkit()
        self.metric = metric
        self.invalid_value = float(invalid_value)

    def score(self, smiles: str) -> float:
        """The reward of one SMILES string."""
        molecule = parse_smiles(smiles)
        if molecule is None:
            return self.invalid_value
        if self.metric == "validity":
            return 1.0
        if self.metric == "qed":
            from rdkit.Chem import QED

            return float(QED.qed(molecule))
        return (10.0 - _sascorer().calculateScore(molecule)) / 9.0

    def __call__(self, prompts: Sequence[str], completions: Sequence[str], **columns: Any) -> list[float]:
        return [self.score(smiles) for smiles in texts_of(completions)]
