"""GSM8K's data preparation: each problem's final answer taken from after "####", the train and test splits saved as
local datasets folders that the recipe's configs read (data/gsm8k/train, data/gsm8k/test).

GSM8K's ``answer`` column is a worked solution ending in ``#### <number>``. The reward compares a completion's final
answer with the number alone, so this script keeps ``question``, puts the number in ``answer`` (thousands commas
removed: ``#### 1,200`` -> ``1200``) and the worked solution in ``solution``; a problem without a ``####`` line is
dropped and counted. The chat prompt is not built here: the configs build it from ``question`` (data.prompt_template,
data.system_prompt and the model's chat template), and ``grpokit explain CONFIG`` shows it.

Run it where the Hugging Face Hub is reachable; the folders it writes then train anywhere:

    python examples/gsm8k/prepare.py                                   # openai/gsm8k (config main) -> data/gsm8k
    python examples/gsm8k/prepare.py --source data/gsm8k-standin       # a local copy with the same columns
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

FINAL = re.compile(r"####\s*(.+?)\s*$")
SPLITS = ("train", "test")


def final_answer(solution: str) -> str | None:
    """The number after the last ``####`` of a GSM8K solution, without thousands commas; None when there is none."""
    found = None
    for line in str(solution).splitlines():
        match = FINAL.search(line)
        if match:
            found = match.group(1)
    if found is None:
        return None
    return re.sub(r"(?<=\d),(?=\d{3}\b)", "", found).rstrip(".") or None


def prepare_rows(rows: list[dict]) -> tuple[list[dict], int]:
    """(prepared rows: question, answer (the final number), solution; how many rows had no ``####`` answer)."""
    out, dropped = [], 0
    for row in rows:
        answer = final_answer(row["answer"])
        if answer is None or not str(row.get("question", "")).strip():
            dropped += 1
            continue
        solution = FINAL.sub("", str(row["answer"])).rstrip()
        out.append({"question": row["question"], "answer": answer, "solution": solution})
    return out, dropped


def split_source(source: str, split: str) -> dict:
    """The dataset mapping of one split of ``source``: ``hf:PATH[:NAME]``, a mapping's text, or a local folder."""
    from grpokit.data.sources import dataset_spec

    spec = dataset_spec(source) or {"path": source}
    return {**spec, "split": split}


def main(argv: list[str] | None = None) -> dict[str, int]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--source",
        default="hf:openai/gsm8k:main",
        help="where GSM8K comes from: hf:PATH[:NAME] (default hf:openai/gsm8k:main) or a local datasets folder with "
        "train and test splits",
    )
    parser.add_argument("--out", default="data/gsm8k", help="folder to write: OUT/train and OUT/test")
    args = parser.parse_args(argv)

    import datasets

    from grpokit.data.sources import DataError, read_source

    prepared, sizes = {}, {}
    for split in SPLITS:
        try:
            rows = read_source(split_source(args.source, split), f"--source ({split})")
        except DataError as exc:
            sys.exit(f"prepare.py: error: {exc}")
        if rows and not {"question", "answer"} <= set(rows[0]):
            sys.exit(
                f"prepare.py: error: {args.source} ({split}) has the columns {', '.join(rows[0])}; GSM8K's are "
                "question and answer."
            )
        kept, dropped = prepare_rows(rows)
        prepared[split], sizes[split] = datasets.Dataset.from_list(kept), len(kept)
        print(f"{split}: {len(kept)} problems ({dropped} without a #### answer dropped) -> {Path(args.out) / split}")
    datasets.DatasetDict(prepared).save_to_disk(args.out)
    return sizes


if __name__ == "__main__":
    main()
