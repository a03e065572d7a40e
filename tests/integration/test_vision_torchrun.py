"""Prompts with images under torchrun (gloo on CPU, 2 processes) on the tiny Qwen2-VL, against one process over the
same prompts: each rank samples and learns its share of the step's prompts with their own pixel inputs (every rank
encodes the dataset's images itself; the groups seeded on their own), so the rollouts, rewards, losses and KL equal
the one process's, as tests/integration/test_distributed.py and test_fsdp.py check for text. DDP (stopped after step
2 and resumed from its checkpoint) and FSDP(2) (evaluating prompts with images on rank 0)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
import torch
from PIL import Image
from safetensors.torch import load_file
from shared_helpers import tiny_run_config
from test_distributed import read_metrics, torchrun

from grpokit.cli import main

pytestmark = pytest.mark.slow
COLOURS = {"red": (255, 0, 0), "green": (0, 200, 0), "blue": (0, 0, 255), "black": (0, 0, 0)}


@pytest.fixture(scope="module")
def vlm_dir(tmp_path_factory):
    from grpokit.testing.tiny_vlm import build_tiny_qwen2_vl

    path = tmp_path_factory.mktemp("tiny-qwen2-vl")
    build_tiny_qwen2_vl(path, words=[*COLOURS, "colour", "?"], image_side=28)
    return path


def write_config(tmp_path: Path, vlm_dir: Path, name: str, **optim) -> Path:
    rows = []
    for colour, rgb in COLOURS.items():
        Image.new("RGB", (28, 28), rgb).save(tmp_path / f"{colour}.png")
        rows.append({"prompt": "colour ?", "images": [str(tmp_path / f"{colour}.png")], "answer": colour})
    return tiny_run_config(
        tmp_path,
        vlm_dir,
        max_steps=3,
        # a target length in characters varies within every group, so advantages, losses and updates are not zero
        rewards=[{"name": "length", "target_length": 12, "unit": "chars"}],
        name=name,
        prompts=rows * 2,
        algo={"scale_rewards": "batch"},
        generation={"max_completion_length": 6},
        optim={"lr_scheduler_type": "constant", "learning_rate": 1e-2, **optim},
        run={"save_steps": 0},
        distributed={"seed_per_group": True},
    )


def stored(run: Path) -> dict:
    with sqlite3.connect(run / "rollouts.sqlite") as db:
        rows = db.execute("SELECT step, prompt_index, completion_index, completion, images FROM rollouts").fetchall()
    return {(s, p, c): (text, images) for s, p, c, text, images in rows}


def compare(tmp_path: Path, vlm_dir: Path, one: str, two: str, tolerance: float) -> None:
    m1, m2 = read_metrics(tmp_path / one), [m for m in read_metrics(tmp_path / two) if "loss" in m]
    assert [m["step"] for m in m2] == [1, 2, 3]
    for a, b in zip(m1, m2, strict=True):
        assert a["reward"] == pytest.approx(b["reward"], abs=1e-6)  # identical rollouts
        assert a["loss"] == pytest.approx(b["loss"], abs=tolerance)
        assert a["kl"] == pytest.approx(b["kl"], abs=tolerance)
        assert a["entropy"] == pytest.approx(b["entropy"], abs=tolerance)
    assert all(m["advantage/std"] > 0 for m in m1)  # every step trains on non-zero advantages
    r1, r2 = stored(tmp_path / one), stored(tmp_path / two)
    # every completion of both ranks, once, each naming its prompt's image; rank 1's steps 2 and 3 are sampled on
    # its own copy of the weights, so equal completions there say its weights equal rank 0's (and the one process's)
    assert len(r2) == 3 * 8 and r1 == r2
    assert all(len(json.loads(images)) == 1 for _, images in r2.values())
    # 3 Adam steps at lr 1e-2: Adam divides each gradient by its own running scale, so where a gradient is near 0
    # the ~1e-7 rounding of the gradient reduction (2 ranks against 2 micro-batches) moves a weight by up to ~2e-5
    # (measured: 1.6e-5 at 1 of 2,048 elements); 1e-4 is 1% of one step's largest move
    wa, wb = (load_file(tmp_path / run / "final" / "model.safetensors") for run in (one, two))
    start = load_file(vlm_dir / "model.safetensors")
    # FSDP's gathered state dict writes the tied lm_head.weight beside the embedding (a copy of it) where
    # save_model writes the embedding once
    embed = next(name for name in wa if name.endswith("embed_tokens.weight"))
    assert all(torch.equal(wb[name], wb[embed]) for name in set(wb) - set(wa)) and set(wa) <= set(wb)
    for name in wa:
        torch.testing.assert_close(wa[name], wb[name], atol=1e-4, rtol=0)
    assert all(not torch.equal(wb[name], start[name]) for name in wa)  # every weight trained, the tower's too


@pytest.fixture(scope="module")
def one_process(vlm_dir, tmp_path_factory):
    """The one-process run over the same prompts (4 per micro-batch x 2 accumulation = 2 ranks x 4 x 1)."""
    tmp_path = tmp_path_factory.mktemp("vision-one")
    config = write_config(tmp_path, vlm_dir, "one", per_device_train_batch_size=4, gradient_accumulation_steps=2)
    assert main(["train", str(config)]) == 0
    return tmp_path / "one"


def test_two_ddp_processes_with_images_match_one_process(vlm_dir, one_process, tmp_path):
    """2 steps, a checkpoint, then resumed to step 3 (each rank encodes the dataset's images again): the numbers of
    the one process's straight 3 steps."""
    import yaml

    two = write_config(tmp_path, vlm_dir, "two", per_device_train_batch_size=4, gradient_accumulation_steps=1)
    config = yaml.safe_load(two.read_text())
    config["optim"]["max_steps"], config["run"]["save_steps"] = 2, 1
    two.write_text(yaml.safe_dump(config))
    torchrun(two)
    config["optim"]["max_steps"], config["run"]["resume_from"] = 3, "latest"
    two.write_text(yaml.safe_dump(config))
    torchrun(two)
    (tmp_path / "one").symlink_to(one_process)
    compare(tmp_path, vlm_dir, "one", "two", 1e-5)


def test_two_fsdp_processes_with_images_match_one_process(vlm_dir, one_process, tmp_path):
    """FSDP2 shards the VLM (vision tower included) over the two ranks; each rank's forward all-gathers the weights,
    so the numbers are DDP's, to the same tolerance (tests/integration/test_fsdp.py's). Evaluation on prompts with
    images runs on rank 0 on the gathered weights (at the start, step 2 and the end)."""
    import yaml

    from grpokit.store import RolloutStore

    two = write_config(tmp_path, vlm_dir, "fsdp", per_device_train_batch_size=4, gradient_accumulation_steps=1)
    config = yaml.safe_load(two.read_text())
    config["distributed"]["strategy"] = "fsdp"
    config["data"]["eval_dataset"] = config["data"]["train_dataset"]  # the 4 pictures, twice
    config["eval"] = {"eval_steps": 2, "num_generations_eval": 2, "pass_at_k": [1]}
    two.write_text(yaml.safe_dump(config))
    torchrun(two)
    (tmp_path / "one").symlink_to(one_process)
    compare(tmp_path, vlm_dir, "one", "fsdp", 1e-5)
    with RolloutStore(tmp_path / "fsdp" / "rollouts.sqlite", readonly=True) as store:
        evals = store.evals()
    assert sorted({e["step"] for e in evals}) == [0, 2, 3]
