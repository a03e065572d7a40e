"""Build what ``grpokit train examples/vision/config.yaml`` needs, offline: the data and the warm-started policy.

    python examples/vision/build.py            # from the repository root

writes ``examples/vision/data/`` (pictures as PNG files; ``train.jsonl`` and ``eval.jsonl``, and the control's
``train_blank.jsonl`` and ``eval_blank.jsonl``: the same rows with every picture uniform grey) and builds the
warm-started policy into ``$GRPOKIT_CACHE/vision-policy-v1`` (``~/.cache/grpokit`` by default), once: a rerun
finds it and returns in seconds. ``--help`` lists the sizes and the warm start's options.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import fields
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import yaml  # noqa: E402
from task import QUESTION, blank, pictures  # noqa: E402
from warm_start import WarmStart, ensure_policy  # noqa: E402

SPLIT_SEEDS = {"train": 0, "eval": 1}


def write_split(folder: Path, split: str, count: int) -> None:
    """``<split>.jsonl`` (rows: the question, the picture's absolute path, the colour) and ``<split>_blank.jsonl``
    (the same rows, each with the blank picture)."""
    images = folder / "images"
    images.mkdir(parents=True, exist_ok=True)
    rows, blank_rows = [], []
    for i, (picture, colour) in enumerate(pictures(count, seed=SPLIT_SEEDS[split])):
        path = images / f"{split}_{i:04d}.png"
        picture.save(path)
        rows.append({"prompt": QUESTION, "images": [str(path)], "answer": colour})
        blank_rows.append({**rows[-1], "images": [str(images / "blank.png")]})
    blank().save(images / "blank.png")
    for name, data in ((split, rows), (f"{split}_blank", blank_rows)):
        (folder / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in data))


def parse(argv: list[str] | None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", default=str(HERE / "data"), help="where the pictures and jsonl files go")
    parser.add_argument("--cache-dir", default=None, help="the policy's cache root (default: $GRPOKIT_CACHE)")
    parser.add_argument("--train", type=int, default=960, help="training pictures (160 of each colour)")
    parser.add_argument("--eval", type=int, default=240, help="held-out pictures (40 of each colour)")
    parser.add_argument("--rebuild", action="store_true", help="build the policy even if it is cached")
    for f in fields(WarmStart):
        parser.add_argument(f"--warm-{f.name.replace('_', '-')}", type=type(f.default), default=f.default)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> Path:
    """Write the data and ensure the policy; returns the policy's folder."""
    from grpokit.system.cached_folders import default_cache_root

    args = parse(argv)
    start = time.perf_counter()
    data = Path(args.data_dir).resolve()
    for split, count in (("train", args.train), ("eval", args.eval)):
        write_split(data, split, count)
    config = WarmStart(**{f.name: getattr(args, f"warm_{f.name}") for f in fields(WarmStart)})
    root = Path(args.cache_dir).expanduser() if args.cache_dir else default_cache_root()
    policy = ensure_policy(root, config, force=args.rebuild)
    print(f"data: {data} ({args.train} train, {args.eval} held-out pictures, and the blank control's)")
    print(f"policy: {policy}")
    print(f"built in {time.perf_counter() - start:.0f}s; now, from the repository root:")
    print(f"  OMP_NUM_THREADS=1 grpokit train examples/vision/config.yaml{_overrides(policy, data)}")
    return policy


def _overrides(policy: Path, data: Path) -> str:
    """The command line's overrides where the policy or the data are not where config.yaml looks for them."""
    from grpokit.system.paths import expand_path

    config = yaml.safe_load((HERE / "config.yaml").read_text())
    out = ""
    if Path(expand_path(config["model"]["model_name_or_path"])) != policy:
        out += f" model_name_or_path={policy}"
    if data != (HERE / "data").resolve():
        out += f" train_dataset={data / 'train.jsonl'} eval_dataset={data / 'eval.jsonl'}"
    return out


if __name__ == "__main__":
    main()
