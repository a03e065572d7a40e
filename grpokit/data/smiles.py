"""SMILES data for molecule generators: reading ``.smi`` files, a character tokenizer, and the
sample-quality metrics of the MOSES benchmark.

The tokenizer is a plain Python object (``encode`` / ``decode`` / ``eos_token_id`` /
``pad_token_id``), not a transformers tokenizer: grpokit accepts any such object. It follows the
convention of character-level SMILES generators (e.g. REINVENT, Olivecrona et al. 2017): ``^``
starts a molecule and ``$`` ends it, so the prompt of unconditional generation is the text ``"^"``.

Metrics (Polykovskiy et al. 2020, "Molecular Sets (MOSES)"), for n generated strings:

* validity = valid / n, where valid strings parse with RDKit into a non-empty molecule;
* uniqueness = distinct canonical SMILES among the valid / valid;
* novelty = distinct canonical SMILES not in the training set / distinct canonical SMILES;
* qed = mean QED over the valid (Bickerton et al. 2012; in [0, 1], higher is more drug-like);
* sa = mean synthetic accessibility score over the valid (Ertl & Schuffenhauer 2009; in [1, 10],
  lower is easier to make).

RDKit (``pip install grpokit[chem]``) is imported only by the functions that need it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path

BOS = "^"
EOS = "$"
PAD = " "
TOKENIZER_FILE = "smiles_tokenizer.json"


def read_smiles(path: str | Path) -> list[str]:
    """The SMILES of a ``.smi`` file: the first whitespace-separated field of each non-empty line."""
    out = []
    for line in Path(path).read_text().splitlines():
        fields = line.split()
        if fields:
            out.append(fields[0])
    return out


class SmilesTokenizer:
    """One token per character; ids 0, 1, 2 are pad (``" "``), bos (``^``), eos (``$``).

    ``encode`` maps text to ids as is (no BOS is added: the prompt ``"^"`` is the BOS);
    ``decode`` drops the three special tokens. A character outside the vocabulary is an error,
    not a silent unknown token, because a generator must never be fed a SMILES it cannot spell.
    """

    def __init__(self, chars: Iterable[str]):
        specials = [PAD, BOS, EOS]
        self.vocab = specials + sorted(set(chars) - set(specials))
        self.index = {ch: i for i, ch in enumerate(self.vocab)}
        self.pad_token_id, self.bos_token_id, self.eos_token_id = 0, 1, 2

    @classmethod
    def from_smiles(cls, smiles: Iterable[str]) -> SmilesTokenizer:
        """A tokenizer whose alphabet is every character of ``smiles``."""
        return cls(ch for s in smiles for ch in s)

    def __len__(self) -> int:
        return len(self.vocab)

    def encode(self, text: str) -> list[int]:
        try:
            return [self.index[ch] for ch in text]
        except KeyError as exc:
            raise ValueError(
                f"character {exc.args[0]!r} is not in the SMILES vocabulary {''.join(self.vocab)!r}"
            ) from None

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        first = 3 if skip_special_tokens else 0
        return "".join(self.vocab[i] for i in ids if i >= first)

    def save_pretrained(self, folder: str | Path) -> None:
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / TOKENIZER_FILE).write_text(json.dumps({"vocab": self.vocab}))

    @classmethod
    def from_pretrained(cls, folder: str | Path) -> SmilesTokenizer:
        vocab = json.loads((Path(folder) / TOKENIZER_FILE).read_text())["vocab"]
        tokenizer = cls(vocab[3:])
        if tokenizer.vocab != vocab:
            raise ValueError(
                f"{folder}/{TOKENIZER_FILE} does not hold a SmilesTokenizer vocabulary (pad, ^, $ first, then sorted "
                "characters)."
            )
        return tokenizer


def canonical_smiles(smiles: str) -> str | None:
    """RDKit's canonical SMILES, or None when the string is not a valid molecule."""
    from rdkit import Chem

    from grpokit.system.molecules import parse_smiles

    molecule = parse_smiles(smiles)
    return None if molecule is None else Chem.MolToSmiles(molecule)


def canonical_set(smiles: Iterable[str]) -> set[str]:
    """Canonical forms of the valid strings of ``smiles`` (the reference set for novelty)."""
    return {c for c in map(canonical_smiles, smiles) if c is not None}


def molecule_metrics(generated: Sequence[str], training_set: set[str]) -> dict[str, float]:
    """validity, uniqueness, novelty, qed and sa (see the module docstring) of ``generated``.

    ``training_set`` holds canonical SMILES (:func:`canonical_set`). Ratios over an empty
    denominator (no valid molecule) are 0; qed and sa are NaN then.
    """
    from rdkit import Chem
    from rdkit.Chem import QED

    from grpokit.system.molecules import parse_smiles
    from grpokit.system.molecules import sascorer as _sascorer

    molecules = [m for m in map(parse_smiles, generated) if m is not None]
    unique = {Chem.MolToSmiles(m) for m in molecules}
    sascorer = _sascorer()
    nan = float("nan")
    return {
        "validity": len(molecules) / len(generated) if generated else 0.0,
        "uniqueness": len(unique) / len(molecules) if molecules else 0.0,
        "novelty": len(unique - training_set) / len(unique) if unique else 0.0,
        "qed": sum(QED.qed(m) for m in molecules) / len(molecules) if molecules else nan,
        "sa": sum(sascorer.calculateScore(m) for m in molecules) / len(molecules) if molecules else nan,
    }
