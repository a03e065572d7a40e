"""Prompts with images sampled ahead (``max_staleness`` 1) on the tiny Qwen2-VL: the policy copy samples each batch
on the previous weights with its prompts' pixel inputs (VisionPrompt) through the producer's queue; the run trains
every parameter, the store's rollouts name their images, and a run stopped with a batch queued resumes to the
straight run's rows, numbers and weights."""

from __future__ import annotations

import signal
import sqlite3
from pathlib import Path

import pytest
import torch
from PIL import Image
from safetensors.torch import load_file
from shared_helpers import logged_steps, signal_after_step

from grpokit import GRPOConfig, GRPOTrainer

pytestmark = pytest.mark.usefixtures("one_thread")
COLOURS = {"red": (255, 0, 0), "green": (0, 200, 0), "blue": (0, 0, 255)}
STEPS = 4


@pytest.fixture(scope="module")
def vlm_dir(tmp_path_factory):
    from grpokit.testing.tiny_vlm import build_tiny_qwen2_vl

    path = tmp_path_factory.mktemp("tiny-qwen2-vl")
    build_tiny_qwen2_vl(path, words=[*COLOURS, "colour", "?"], image_side=28)
    return path


def colour_reward(completions, answer, image, **kwargs):
    assert all(isinstance(i, Image.Image) for i in image)
    return [float(a in c[0]["content"].split()) for c, a in zip(completions, answer)]


def trainer(vlm_dir, run: Path, **overrides) -> GRPOTrainer:
    from grpokit.models.vision import load_processor

    chat = [{"role": "user", "content": "colour ?"}]
    rows = [{"prompt": chat, "image": Image.new("RGB", (30, 30), rgb), "answer": n} for n, rgb in COLOURS.items()]
    values = dict(
        output_dir=str(run), num_generations=4, per_device_train_batch_size=8, max_completion_length=3,
        max_steps=STEPS, learning_rate=1e-2, report_to=["jsonl"], disable_tqdm=True, beta=0.04, max_staleness=1,
        save_steps=0, lr_scheduler_type="constant",
    )  # fmt: skip
    return GRPOTrainer(
        model=str(vlm_dir),
        reward_funcs=colour_reward,
        args=GRPOConfig(**{**values, **overrides}),
        train_dataset=rows * 2,
        processing_class=load_processor(str(vlm_dir)),
    )


def stored(run: Path) -> list[tuple]:
    with sqlite3.connect(run / "rollouts.sqlite") as db:
        rows = db.execute(
            "SELECT step, prompt_index, completion_index, completion, policy_version, advantage, images FROM rollouts "
            "ORDER BY step, prompt_index, completion_index"
        ).fetchall()
        images = {h for (h,) in db.execute("SELECT sha256 FROM images")}
    return rows, images


def test_sampling_ahead_trains_a_vlm_and_stores_its_images(vlm_dir, tmp_path):
    import json

    from transformers import AutoModelForImageTextToText

    run = tmp_path / "run"
    t = trainer(vlm_dir, run)
    before = {n: p.detach().clone() for n, p in AutoModelForImageTextToText.from_pretrained(vlm_dir).named_parameters()}
    t.train()
    moved = {n for n, p in t.model.named_parameters() if not torch.equal(p.detach(), before[n])}
    assert moved == set(before)  # the vision tower and projector too
    rows, images = stored(run)
    assert len(rows) == STEPS * 2 * 4
    # admission by step: step s is sampled by version max(0, s - 2) (one step behind the weights that train it)
    assert {(r[0], r[4]) for r in rows} == {(s, max(0, s - 2)) for s in range(1, STEPS + 1)}
    named = [json.loads(r[6]) for r in rows]
    assert all(len(n) == 1 for n in named) and {n[0] for n in named} == images and len(images) == 3
    steps = [m for m in logged_steps(run)]
    assert [m["policy_staleness"] for m in steps] == [0, 1, 1, 1]


def test_a_vlm_run_stopped_with_a_batch_queued_resumes_exactly(vlm_dir, tmp_path):
    straight = tmp_path / "straight"
    trainer(vlm_dir, straight).train()
    run = tmp_path / "run"
    first = trainer(vlm_dir, run)
    signal_after_step(first, 2, signal.SIGTERM)
    first.train()
    assert first.step == 2
    queue = torch.load(run / "checkpoints" / "step-2" / "states.pt", weights_only=True)["pending_rollouts"]["queue"]
    assert [(e["step"], e["rollouts"]["policy_version"]) for e in queue] == [(3, 1)]
    trainer(vlm_dir, run, resume_from="latest").train()
    assert stored(run) == stored(straight)
    for a, b in zip(logged_steps(straight), logged_steps(run), strict=True):
        for key in ("loss", "kl", "grad_norm", "reward", "policy_staleness"):
            assert a.get(key) == pytest.approx(b.get(key), abs=1e-6), (a.get("step"), key)
    wa, wb = load_file(straight / "final" / "model.safetensors"), load_file(run / "final" / "model.safetensors")
    for name in wa:
        torch.testing.assert_close(wa[name], wb[name], atol=1e-6, rtol=0)
