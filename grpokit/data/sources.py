"""Where a dataset's rows come from: a file (JSONL, JSON, Parquet, CSV), a datasets folder (save_to_disk), a
built-in task, or anything ``datasets.load_dataset`` loads: a hub dataset, a builder with data files
(``{path: json, data_files: ...}``), a folder of data files.

The config names the last kind as a mapping of load_dataset's arguments (``{path: openai/gsm8k, name: main,
split: train}``) or in short as ``hf:PATH[:NAME[:SPLIT]]`` (``hf:openai/gsm8k:main:train``). A load that needs the
Hugging Face Hub first checks, within seconds, that the hub answers: huggingface_hub retries an unreachable hub for
about half a minute before it gives up, and a run should fail at once with what to do. Every failure is a
:class:`DataError` of one line.
"""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path
from typing import Any

from grpokit.models import hub
from grpokit.system.paths import expand_path

HUB_PREFIX = "hf:"
_HUB_ID = re.compile(r"[\w.-]+/[\w.-]+")

# The keys of a dataset mapping (``{path, name, split, ...}``): datasets.load_dataset's own arguments.
DATASET_KEYS = ("path", "name", "split", "data_files", "data_dir", "revision")


class DataError(ValueError):
    """A dataset problem, with a message that names the fix."""


def dataset_spec(source: Any) -> dict | None:
    """The ``datasets.load_dataset`` arguments a source names (a mapping as given; ``hf:PATH[:NAME[:SPLIT]]`` parsed,
    an empty NAME skipped: ``hf:PATH::SPLIT``), or None for the other forms (a path, ``builtin:...``, rows)."""
    if isinstance(source, dict):
        return dict(source)
    if isinstance(source, str) and source.startswith(HUB_PREFIX):
        parts = source[len(HUB_PREFIX) :].split(":", 2)  # a split may hold a colon: train[:100]
        spec = dict(zip(("path", "name", "split"), parts))
        return {k: v for k, v in spec.items() if v}
    return None


def read_source(source: str | Path | dict, name: str = "train_dataset") -> list[dict]:
    """The rows of a dataset named by a path, ``builtin:<task>``, ``hf:...`` or a mapping (see the module docstring)."""
    spec = dataset_spec(source)
    if spec is not None:
        return load_spec(spec, name)
    path = str(source)
    if path.startswith("builtin:"):
        return _builtin(path.split(":", 1)[1], name)
    return _read_path(path, name)


# ---- datasets.load_dataset and save_to_disk folders -----------------------------------------------------------


def load_spec(spec: dict, name: str) -> list[dict]:
    """Rows of ``datasets.load_dataset(**spec)``, or of a save_to_disk folder (``path``) with its ``split``."""
    unknown = [k for k in spec if k not in DATASET_KEYS]
    if unknown or not spec.get("path"):
        raise DataError(
            f"{name}: a dataset mapping takes {', '.join(DATASET_KEYS)}, with a path (got {', '.join(map(str, spec))})."
        )
    spec = {k: v for k, v in spec.items() if v is not None}
    path = expand_path(str(spec["path"]))
    split = spec.get("split")
    if saved_folder(Path(path)):
        extra = sorted(set(spec) - {"path", "split"})
        if extra:
            raise DataError(
                f"{name}: {path} is a save_to_disk folder, which takes only split; remove {', '.join(extra)} "
                "(arguments of datasets.load_dataset)."
            )
        import datasets

        return _one_split(datasets.load_from_disk(path), split, name, path).to_list()
    import datasets

    offline = bool(datasets.config.HF_HUB_OFFLINE)
    if not offline and needs_hub(path, spec.get("data_files")):
        reason = hub.unreachable()
        if reason is not None:
            raise DataError(
                f"{name}: cannot load {path!r}: the Hugging Face Hub ({hub.endpoint()}) does not answer ({reason}); "
                "connect this machine (HF_ENDPOINT names a mirror), set HF_HUB_OFFLINE=1 to use a copy in the local "
                "datasets cache, or save the dataset where the hub answers (save_to_disk) and give that folder."
            )
    kwargs = {k: spec[k] for k in ("name", "data_files", "data_dir", "revision") if k in spec}
    if "data_files" in kwargs:
        kwargs["data_files"] = _expand_files(kwargs["data_files"])
    try:
        loaded = datasets.load_dataset(path, split=split, **kwargs)
    except Exception as exc:  # datasets raises many types; each becomes one line naming the fix
        raise DataError(_load_error(name, path, exc, offline)) from None
    return _one_split(loaded, None, name, path).to_list()


def saved_folder(path: Path) -> bool:
    """Whether ``path`` is a folder written by ``Dataset.save_to_disk`` or ``DatasetDict.save_to_disk``."""
    return path.is_dir() and ((path / "state.json").is_file() or (path / "dataset_dict.json").is_file())


def needs_hub(path: str, data_files: Any = None) -> bool:
    """Whether load_dataset(path, data_files=...) reads from the hub: not for a local file or folder, nor for a
    builder (json, csv, parquet, ...) whose data files are local."""
    if Path(path).exists():
        return False
    from datasets.packaged_modules import _PACKAGED_DATASETS_MODULES

    if path in _PACKAGED_DATASETS_MODULES:
        return "://" in json.dumps(data_files)  # hf:// or https:// data files
    return True


def _expand_files(files: Any) -> Any:
    if isinstance(files, str):
        return expand_path(files)
    if isinstance(files, list):
        return [_expand_files(f) for f in files]
    if isinstance(files, dict):
        return {k: _expand_files(v) for k, v in files.items()}
    return files


def _one_split(loaded: Any, split: str | None, name: str, path: str):
    """A Dataset from what was loaded: a DatasetDict gives ``split``, or its only split."""
    if not hasattr(loaded, "keys"):  # a Dataset
        if split is not None:
            raise DataError(f"{name}: {path} holds one dataset without splits; remove split: {split}.")
        return loaded
    splits = list(loaded.keys())
    if split is None and len(splits) == 1:
        return loaded[splits[0]]
    if split is None:
        raise DataError(
            f"{name}: {path} has the splits {', '.join(splits)}; choose one with split, e.g. {{path: {path}, split: "
            f"{splits[0]}}}."
        )
    if split not in splits:
        raise DataError(f"{name}: {path} has no split {split!r}; its splits are {', '.join(splits)}.")
    return loaded[split]


def _load_error(name: str, path: str, exc: Exception, offline: bool) -> str:
    """One line for a failed load_dataset: what went wrong and what to do."""
    kind = type(exc).__name__
    text = " ".join(str(exc).split()) or kind
    if kind == "DatasetNotFoundError":
        return (
            f"{name}: no dataset {path!r} on the Hugging Face Hub, nor a local folder of that name (or it is private "
            "or gated: log in with `hf auth login`); check the id, e.g. openai/gsm8k."
        )
    if offline and isinstance(exc, ConnectionError):
        return (
            f"{name}: {path!r} is not in the local datasets cache and offline mode is on (HF_HUB_OFFLINE or "
            "HF_DATASETS_OFFLINE); unset it where the hub is reachable, or give a local copy (a save_to_disk folder "
            "or data files)."
        )
    if isinstance(exc, ConnectionError):
        return f"{name}: cannot load {path!r} from the Hugging Face Hub ({text[:200]}); check the connection and retry."
    return f"{name}: datasets.load_dataset({path!r}) failed: {text[:400]}"


# ---- files and built-in tasks ---------------------------------------------------------------------------------


def _read_path(path: str, name: str) -> list[dict]:
    p = Path(path).expanduser()
    if not p.exists():
        hint = ""
        if _HUB_ID.fullmatch(path) and p.suffix.lower() not in (".jsonl", ".json", ".csv", ".parquet"):
            hint = (
                f" For the hub dataset {path}, write hf:{path}:NAME:SPLIT or {{path: {path}, name: NAME, split: SPLIT}}"
                " (NAME: its config, e.g. main; SPLIT: e.g. train)."
            )
        raise DataError(
            f"{name} {path!r} does not exist; give the path of a .jsonl, .parquet or .csv file or of a datasets "
            f"folder.{hint}"
        )
    if p.is_dir():
        if not saved_folder(p):
            raise DataError(
                f"{name} {path!r} is a folder but not a save_to_disk one (no state.json or dataset_dict.json); for a "
                f"folder of data files write {{path: {path}, split: train}}."
            )
        import datasets

        return _one_split(datasets.load_from_disk(str(p)), None, name, path).to_list()
    suffix = p.suffix.lower()
    if suffix in (".jsonl", ".json"):
        text = p.read_text()
        if suffix == ".json" and text.lstrip().startswith("["):
            return json.loads(text)
        rows = []
        for n, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise DataError(
                        f"{p}:{n} is not valid JSON ({exc.msg}); each line must be one JSON object."
                    ) from None
        return rows
    if suffix == ".csv":
        with p.open(newline="") as f:
            return list(csv.DictReader(f))
    if suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.read_table(p).to_pylist()
    raise DataError(f"{name} {path!r}: unknown file type {suffix!r}; use .jsonl, .json, .parquet or .csv.")


def _builtin(task: str, name: str) -> list[dict]:
    spec, _, split = task.partition("/")
    if spec == "arithmetic":
        from grpokit.data import arithmetic

        train, held_out = arithmetic.arithmetic_splits()
        return held_out if split in ("eval", "test") else train
    raise DataError(f"{name}: unknown built-in task {task!r}; available: builtin:arithmetic, builtin:arithmetic/eval.")
