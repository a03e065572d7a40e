"""``molecule``: score SMILES completions with RDKit (``pip install grpokit[chem]``).

Metrics: ``validity`` (1.0 when RDKit parses a non-empty molecule), ``qed`` (quantitative
estimate of drug-likeness, Bickerton et al. 2012, already in [0, 1]) and ``sa`` (synthetic
accessibility, Ertl & Schuffenhauer 2009, from RDKit's Contrib ``sascorer``: a score in
[1, 10] where lower is easier, mapped to [0, 1] as (10 - sa) / 9 so that higher is better).
An invalid or empty SMILES gets ``invalid_value`` whatever the metric.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from grpokit.rewards.contract import texts_of
from grpokit.rewards.registry import BUILTINS
from grpokit.system.molecules import parse_smiles, sascorer

METRICS = ("validity", "qed", "sa")


def _require_rdkit() -> None:
    try:
        import rdkit  # noqa: F401
    except ImportError as exc:
        raise ImportError("the molecule reward needs RDKit: pip install grpokit[chem]") from exc


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
        return (10.0 - sascorer().calculateScore(molecule)) / 9.0

    def __call__(self, prompts: Sequence[str], completions: Sequence[str], **columns: Any) -> list[float]:
        return [self.score(smiles) for smiles in texts_of(completions)]
