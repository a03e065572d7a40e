"""The ``trl-internal-testing/zen-image`` and ``zen-multi-image`` configs, built offline from the ``zen`` texts.

TRL's ``scripts/generate_zen_image_dataset.py`` writes every conversational config of ``zen`` (the same 19 rows,
the same texts and 17/2 train/test split) with an ``image`` column: one random uint8 RGB array per row, each side
drawn from [32, 64). ``generate_zen_multi_image_dataset.py`` writes the conversational configs but the implicit-
prompt preference one with typed content (``[{"type": "image"}, {"type": "text", "text": ...}]``) and an ``images``
column, 0 to 3 images per row at the places of ``MULTI_LAYOUT``. Here the texts come from ``zen`` itself (the
suite's copy of TRL's generate_zen_dataset.py, run with its push captured, as the suite's build_fixtures.py does)
and the images from numpy with a fixed seed (TRL's are unseeded).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
CONVERSATIONAL = [
    "conversational_language_modeling", "conversational_prompt_only", "conversational_prompt_completion",
    "conversational_preference", "conversational_implicit_prompt_preference", "conversational_unpaired_preference",
]  # fmt: skip
# zen-multi-image's first message per row: I an image, T the row's text; "Is" | " never better ..." is split
MULTI_LAYOUT = ["IT", "TI", "ITI", "IIT", "IT", "TI", "ITI", "T", "TII", "IITI", "IT", "TI", "ITII", "T", "TI",
                "TIT", "IT", "TI", "T"]  # fmt: skip
SPLIT_AT = {15: 2}  # row 15's text splits after its first 2 characters


def zen_script() -> Path:
    suite = Path(os.environ.get("TRL_SUITE", ROOT.parent / "shared" / "trl_suite"))
    path = Path(os.environ.get("TRL_ZEN_SCRIPT", suite / "upstream" / "scripts" / "generate_zen_dataset.py"))
    if not path.exists():
        raise SystemExit(f"build_vlm_fixtures: no zen script at {path}; set TRL_ZEN_SCRIPT or TRL_SUITE")
    return path


def zen_configs() -> dict:
    """{config: DatasetDict} of TRL's zen script (its main() run with push_to_hub captured, nothing uploaded)."""
    from datasets import Dataset, DatasetDict

    captured = {}
    saved = Dataset.push_to_hub, DatasetDict.push_to_hub

    def capture(self, repo_id, config_name="default", **kwargs):
        captured[config_name] = self

    Dataset.push_to_hub = DatasetDict.push_to_hub = capture
    try:
        spec = importlib.util.spec_from_file_location("trl_zen_script", zen_script())
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # its dataclass looks its module up there
        spec.loader.exec_module(module)
        module.main(test_size=0.1, push_to_hub=True, repo_id="trl-internal-testing/zen")
    finally:
        Dataset.push_to_hub, DatasetDict.push_to_hub = saved
        sys.modules.pop("trl_zen_script", None)
    return captured


def random_image(rng: np.random.Generator) -> np.ndarray:
    h, w = rng.integers(32, 64, size=2)
    return rng.uniform(0.0, 255.0, size=(h, w, 3)).astype(np.uint8)


def typed(message: dict, layout: str = "T", split_at: int | None = None) -> dict:
    text = message["content"]
    parts = [text[:split_at], text[split_at:]] if split_at else [text]
    content = [{"type": "image", "text": None} if c == "I" else {"type": "text", "text": parts.pop(0)} for c in layout]
    return {"role": message["role"], "content": content}


def multi_row(row: dict, index: int) -> dict:
    """One zen row in zen-multi-image's form: typed content, the first message laid out as MULTI_LAYOUT says."""
    out = {}
    for column, value in row.items():
        if isinstance(value, list):
            first = column in ("messages", "prompt")  # the images go in the first message of these columns
            out[column] = [
                typed(m, MULTI_LAYOUT[index], SPLIT_AT.get(index)) if first and j == 0 else typed(m)
                for j, m in enumerate(value)
            ]
        else:
            out[column] = value
    return out


def with_images(dd, multi: bool, rng: np.random.Generator):
    from datasets import Dataset, DatasetDict, Features, Image, List, Value, concatenate_datasets

    rows = concatenate_datasets([dd["train"], dd["test"]])
    n_train = len(dd["train"])
    if multi:
        data = [multi_row(row, i) for i, row in enumerate(rows)]
        counts = [MULTI_LAYOUT[i].count("I") for i in range(len(data))]
        columns = {c: [r[c] for r in data] for c in rows.column_names}
        columns["images"] = [[random_image(rng) for _ in range(k)] for k in counts]
        message = List({"content": List({"text": Value("string"), "type": Value("string")}), "role": Value("string")})
        features = {c: (message if isinstance(rows[0][c], list) else rows.features[c]) for c in rows.column_names}
        features["images"] = List(Image())
    else:
        columns = {c: rows[c] for c in rows.column_names}
        columns["image"] = [random_image(rng) for _ in range(len(rows))]
        features = dict(rows.features, image=Image())
    full = Dataset.from_dict(columns, features=Features(features))
    return DatasetDict(train=full.select(range(n_train)), test=full.select(range(n_train, len(full))))


def build_datasets(out: Path, seed: int = 0) -> list[str]:
    """Write zen-image and zen-multi-image (every config TRL's scripts write) under out; one line per config."""
    zen = zen_configs()
    lines = []
    for name, multi in (("zen-image", False), ("zen-multi-image", True)):
        rng = np.random.default_rng(seed)
        for config in CONVERSATIONAL:
            if multi and config == "conversational_implicit_prompt_preference":
                continue  # TRL's multi-image script writes no implicit-prompt config
            dd = with_images(zen[config], multi, rng)
            dd.save_to_disk(str(out / name / config))
            lines.append(f"built {name}/{config}: {dict(dd.num_rows)} rows, columns {dd['train'].column_names}")
    return lines
