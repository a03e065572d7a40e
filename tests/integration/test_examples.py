"""Shortened runs of examples/molecules and examples/fill_in: the same code path as the README
commands (pre-training, caching, before/after measurements, GRPO), with tiny sizes and few steps."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest
import torch

EXAMPLES = Path(__file__).parents[2] / "examples"


@pytest.fixture()
def load_example():
    """Import ``examples/<name>/run.py``; afterwards restore sys.path and drop the example's sibling modules."""
    saved_path, saved_modules = list(sys.path), set(sys.modules)
    threads = torch.get_num_threads()

    def load(name: str):
        spec = importlib.util.spec_from_file_location(f"example_{name}_run", EXAMPLES / name / "run.py")
        module = sys.modules[spec.name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    yield load
    sys.path[:] = saved_path
    for name in set(sys.modules) - saved_modules:
        if name.startswith(("example_", "chargpt", "spans", "judge", "policy")):
            del sys.modules[name]
    torch.set_num_threads(threads)  # run.py sets its own thread count


def test_molecules_example_short_run(tmp_path, load_example):
    pytest.importorskip("rdkit")
    run = load_example("molecules")
    smiles = (EXAMPLES / "molecules" / "data" / "moses_sample.smi").read_text().splitlines()[:300]
    data = tmp_path / "small.smi"
    data.write_text("\n".join(smiles) + "\n")
    argv = [
        "--data",
        str(data),
        "--cache-dir",
        str(tmp_path / "cache"),
        "--samples",
        "16",
        "--pretrain-steps",
        "30",
        "--pretrain-d-model",
        "32",
        "--pretrain-n-layers",
        "1",
        "--pretrain-batch-size",
        "16",
        "max_steps=3",
        "num_generations=8",
        "per_device_train_batch_size=8",
        "max_completion_length=30",
        "ref_model_sync_steps=2",
        f"output_dir={tmp_path / 'run'}",
    ]
    result = run.main(argv)

    for when in ("before", "after"):
        metrics = result[when]
        assert set(metrics) == {"validity", "uniqueness", "novelty", "qed", "sa"}
        assert all(0.0 <= metrics[k] <= 1.0 for k in ("validity", "uniqueness", "novelty"))
        # qed in [0, 1] and sa in [1, 10] over the valid molecules, NaN when none is valid
        assert math.isnan(metrics["qed"]) or 0.0 <= metrics["qed"] <= 1.0
        assert math.isnan(metrics["sa"]) or 1.0 <= metrics["sa"] <= 10.0
    assert json.loads((tmp_path / "run" / "molecules.json").read_text())["after"] == pytest.approx(
        result["after"], nan_ok=True
    )
    steps = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == [1, 2, 3]
    assert {"rewards/molecule/mean", "rewards/molecule_2/mean", "kl"} <= set(steps[-1])

    # the pre-trained model is cached: a second run reuses the folder instead of training again
    cached = list((tmp_path / "cache").glob("chargpt-*"))
    assert len(cached) == 1
    stamp = (cached[0] / "model.safetensors").stat().st_mtime_ns
    run.main([*argv[:-1], "max_steps=1", f"output_dir={tmp_path / 'run2'}"])
    assert (cached[0] / "model.safetensors").stat().st_mtime_ns == stamp


@pytest.mark.parametrize("config", ["config.yaml", "config_lora.yaml"])
def test_fill_in_example_short_run(tmp_path, load_example, config):
    if config == "config_lora.yaml":
        pytest.importorskip("peft")
    run = load_example("fill_in")
    argv = [
        "--config",
        config,
        "--cache-dir",
        str(tmp_path / "cache"),
        "--n-eval",
        "24",
        "--policy-steps",
        "20",
        "--policy-hidden-size",
        "32",
        "--judge-steps",
        "20",
        "--judge-d-model",
        "32",
        "max_steps=2",
        "num_generations=4",
        "per_device_train_batch_size=16",
        f"output_dir={tmp_path / 'run'}",
    ]
    result = run.main(argv)

    for when in ("before", "after"):
        assert set(result[when]) == {"judge_score", "exact_match", "greedy_judge_score", "greedy_exact_match"}
        assert all(0.0 <= v <= 1.0 for v in result[when].values())
    steps = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == [1, 2]
    assert 0.0 <= steps[-1]["rewards/judge/mean"] <= 1.0
    assert sorted(p.name.split("-")[0] for p in (tmp_path / "cache").iterdir()) == ["judge", "policy"]
    final = tmp_path / "run" / "final"
    if config == "config_lora.yaml":  # the adapter, and the merged weights (lora.merge_on_save)
        assert (final / "adapter_config.json").is_file() and (final / "merged" / "config.json").is_file()
    else:
        assert (final / "config.json").is_file()


def test_fill_in_task_is_unambiguous_and_split():
    sys.path.insert(0, str(EXAMPLES / "fill_in"))
    try:
        import spans
    finally:
        sys.path.remove(str(EXAMPLES / "fill_in"))
        sys.modules.pop("spans", None)
    texts = spans.all_texts()
    answers: dict[str, set] = {}
    for t in texts:
        answers.setdefault(t.prompt, set()).add(t.answer)
    assert all(len(a) == 1 for a in answers.values())  # each prompt has exactly one right span
    train, held_out = spans.splits(n_eval=50)
    assert len(held_out) == 50 and not {t.prompt for t in train} & {t.prompt for t in held_out}
    # "tuesday _ saturday sunday" hides three days, read from both sides of the gap
    text = spans.Text(("tuesday", "wednesday", "thursday", "friday", "saturday", "sunday"), 1, 3, "days", 1)
    assert text.prompt == "tuesday _ saturday sunday = " and text.answer == "wednesday thursday friday"
    # the judge reads the text with the completion written into the gap
    assert spans.fill(text.prompt, text.answer) == "tuesday wednesday thursday friday saturday sunday"
    assert spans.fill(text.prompt, "") == "tuesday saturday sunday"
    import random

    rng = random.Random(0)
    assert all(spans.corrupt(t, rng) != t.answer for t in texts[:500])
