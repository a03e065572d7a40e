"""grpokit.data.sources: datasets named in the config (save_to_disk folders, datasets.load_dataset by mapping or
hf:PATH:NAME:SPLIT, files) and the one-line failures, the unreachable hub's included, for real on this machine."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from grpokit.config import ConfigError, GRPOConfig, load_config
from grpokit.data import sources
from grpokit.data.sources import DataError, dataset_spec, read_source
from grpokit.models import hub

ROOT = Path(__file__).parents[2]
TRAIN = [{"question": f"What is {i} + 1?", "answer": f"{i} + 1 = {i + 1}\n#### {i + 1}"} for i in range(5)]
TEST = [{"question": "What is 7 + 2?", "answer": "#### 9"}, {"question": "What is 1 + 1?", "answer": "#### 2"}]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """A DatasetDict and a Dataset written by save_to_disk, a folder of parquet files whose README names two
    configs (as hub datasets such as openai/gsm8k do), and a JSONL file."""
    import datasets

    root = tmp_path_factory.mktemp("datasets")
    splits = datasets.DatasetDict(
        {"train": datasets.Dataset.from_list(TRAIN), "test": datasets.Dataset.from_list(TEST)}
    )
    splits.save_to_disk(str(root / "dict"))
    splits["test"].save_to_disk(str(root / "single"))
    for config in ("main", "socratic"):
        (root / "hub" / config).mkdir(parents=True)
        splits["train"].to_parquet(str(root / "hub" / config / "train.parquet"))
        splits["test"].to_parquet(str(root / "hub" / config / "test.parquet"))
    card = ["---", "configs:"]
    for config in ("main", "socratic"):
        card += [f"- config_name: {config}", "  data_files:"]
        card += [f"  - split: {s}\n    path: {config}/{s}.parquet" for s in ("train", "test")]
    (root / "hub" / "README.md").write_text("\n".join([*card, "---", ""]))
    (root / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in TRAIN))
    return root


def test_save_to_disk_folders(folders):
    assert read_source(str(folders / "single")) == TEST  # a Dataset folder, by its path as before
    assert read_source({"path": str(folders / "dict"), "split": "train"}) == TRAIN
    assert read_source(f"hf:{folders / 'dict'}::test") == TEST  # the short form, no config name
    with pytest.raises(DataError, match=r"has the splits train, test; choose one with split, e\.g\. \{path: .*, split"):
        read_source(str(folders / "dict"))
    with pytest.raises(DataError, match=r"has no split 'tset'; its splits are train, test\."):
        read_source({"path": str(folders / "dict"), "split": "tset"})
    with pytest.raises(DataError, match=r"is a save_to_disk folder, which takes only split; remove name"):
        read_source({"path": str(folders / "dict"), "name": "main", "split": "train"})
    with pytest.raises(DataError, match=r"holds one dataset without splits; remove split: train"):
        read_source({"path": str(folders / "single"), "split": "train"})


def test_load_dataset_as_it_loads_a_hub_dataset(folders):
    """A folder laid out as a hub dataset repo (data files and a card naming configs), loaded by datasets.load_dataset
    with its config name and split: the mapping form and hf:PATH:NAME:SPLIT."""
    hub = str(folders / "hub")
    assert read_source({"path": hub, "name": "main", "split": "test"}) == TEST
    assert read_source(f"hf:{hub}:socratic:train") == TRAIN
    assert read_source(f"hf:{hub}:main:train[:2]") == TRAIN[:2]  # load_dataset's split slicing
    with pytest.raises(DataError, match=r"BuilderConfig 'mian' not found\. Available: \['main', 'socratic'\]"):
        read_source({"path": hub, "name": "mian", "split": "test"})
    with pytest.raises(DataError, match=r"Unknown split \"tset\"\. Should be one of \['train', 'test'\]"):
        read_source({"path": hub, "name": "main", "split": "tset"})
    with pytest.raises(DataError, match=r"has the splits train, test; choose one with split"):
        read_source({"path": hub, "name": "main"})
    with pytest.raises(DataError, match=r"is a folder but not a save_to_disk one .* write \{path: .*, split: train\}"):
        read_source(hub)


def test_builder_with_data_files(folders):
    files = str(folders / "rows.jsonl")
    assert read_source({"path": "json", "data_files": files}) == TRAIN  # one split: taken
    assert read_source({"path": "json", "data_files": {"train": files}, "split": "train[1:3]"}) == TRAIN[1:3]
    assert not sources.needs_hub("json", files) and sources.needs_hub("json", "hf://datasets/openai/gsm8k/x.parquet")
    assert sources.needs_hub("openai/gsm8k") and not sources.needs_hub(str(folders / "hub"))


def test_short_form_and_config_values():
    assert dataset_spec("hf:openai/gsm8k:main:train[:100]") == {
        "path": "openai/gsm8k",
        "name": "main",
        "split": "train[:100]",  # the split keeps its colon
    }
    assert dataset_spec("hf:openai/gsm8k") == {"path": "openai/gsm8k"}
    assert dataset_spec("train.jsonl") is None and dataset_spec("builtin:arithmetic") is None
    cfg = load_config(None, ["train_dataset={path: openai/gsm8k, name: main, split: train}", "eval_dataset=007"])
    assert cfg.train_dataset == {"path": "openai/gsm8k", "name": "main", "split": "train"}
    assert cfg.eval_dataset == "007"  # a path stays text
    assert GRPOConfig(train_dataset={"path": "json", "data_files": ["a.jsonl"]}).train_dataset["data_files"] == [
        "a.jsonl"
    ]
    bad = [
        ({"path": "openai/gsm8k", "splt": "train"}, r"unknown key 'splt'; a dataset mapping takes path, name, split.*"),
        ({"name": "main"}, r"train_dataset needs a path"),
        ({"path": "x", "split": 1}, r"train_dataset\.split=1 must be a string"),
        ("hf::main", r"names no dataset; write hf:PATH\[:NAME\[:SPLIT\]\]"),
        (["a.jsonl"], r"expected str or dict, got list"),
    ]
    for value, message in bad:
        with pytest.raises(ConfigError, match=message):
            GRPOConfig(train_dataset=value)
    with pytest.raises(ConfigError, match=r"Did you mean 'split'\?"):
        GRPOConfig(eval_dataset={"path": "x", "splt": "test"})


def test_a_hub_id_given_as_a_path_gets_the_hint(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(DataError) as info:
        read_source("openai/gsm8k")
    message = str(info.value)
    assert "does not exist" in message and "write hf:openai/gsm8k:NAME:SPLIT" in message and "\n" not in message
    with pytest.raises(DataError) as info:
        read_source("data/train.jsonl")
    assert "hf:" not in str(info.value)  # a file name is not taken for a hub id


def test_an_unreachable_hub_fails_at_once(monkeypatch):
    """Offline mode off and a hub endpoint that refuses connections: the probe, not load_dataset's half-minute of
    retries, decides, and the message says what to do."""
    import datasets

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    called = []
    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: called.append(a))
    with pytest.raises(DataError) as info:
        read_source("hf:openai/gsm8k:main:train", "train_dataset")
    message = str(info.value)
    assert message.startswith(
        f"train_dataset: cannot load 'openai/gsm8k': the Hugging Face Hub (http://127.0.0.1:{port})"
    )
    assert "does not answer (" in message and "HF_HUB_OFFLINE=1" in message and "save_to_disk" in message
    assert called == []  # load_dataset never ran


def test_a_hub_that_accepts_but_never_answers_is_given_up_on(monkeypatch):
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        accepted = []
        threading.Thread(target=lambda: accepted.append(server.accept()), daemon=True).start()
        monkeypatch.setattr(hub, "PROBE_SECONDS", 0.5)
        started = time.monotonic()
        reason = hub._unreachable(f"http://127.0.0.1:{port}")
    assert reason is not None  # a connection that never answers counts as unreachable
    assert time.monotonic() - started < 5  # given up on after the probe's 0.5 s, not left hanging


def _load_in_subprocess(spec: str, **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")}
    code = (
        "import sys\nfrom grpokit.data.sources import DataError, read_source\n"
        f"try:\n    read_source({spec!r})\nexcept DataError as exc:\n    print(exc, file=sys.stderr)\n    sys.exit(2)\n"
    )
    return subprocess.run(
        [sys.executable, "-c", code],
        env={**clean, **env, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=180,  # a guard against a hang, not a measurement
    )


def test_the_hub_for_real_on_this_machine():
    """This machine cannot reach huggingface.co: with offline mode off the probe reports it; with HF_HUB_OFFLINE or
    HF_DATASETS_OFFLINE the dataset is looked up in the cache only, and is not there."""
    online = _load_in_subprocess("hf:openai/gsm8k:main:train")
    if online.returncode == 0:
        pytest.skip("this machine reaches the Hugging Face Hub")
    assert online.returncode == 2, online.stderr
    last = online.stderr.strip().splitlines()[-1]
    assert last.startswith("train_dataset: cannot load 'openai/gsm8k': the Hugging Face Hub") and "Retrying" not in (
        online.stderr
    )
    for variable in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        offline = _load_in_subprocess("hf:openai/gsm8k:main:train", **{variable: "1"})
        assert offline.returncode == 2, offline.stderr
        assert offline.stderr.strip().splitlines()[-1] == (
            "train_dataset: 'openai/gsm8k' is not in the local datasets cache and offline mode is on (HF_HUB_OFFLINE "
            "or HF_DATASETS_OFFLINE); unset it where the hub is reachable, or give a local copy (a save_to_disk folder "
            "or data files)."
        )
