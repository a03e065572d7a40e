"""A tool that returns an image (TRL's test_train_with_tools_multimodal_response) trains end to end through
GRPOTrainer on a tiny Qwen2-VL with its processor: the tool's image reaches the model (the vision tower, which no
prompt image feeds here, moves), the store keeps the tool's image once by its hash, and the log has TRL's
tools/call_frequency. A stand-in parser (tools_for_tests.screenshot_every_other_turn) reads random turns as calls."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from PIL import Image

from grpokit import GRPOConfig, GRPOTrainer
from grpokit.models.vision_inputs import image_hash
from grpokit.store import RolloutStore

pytestmark = pytest.mark.usefixtures("one_thread")
TOOLS = Path(__file__).parent / "tools_for_tests.py"
SCREENS = [(255, 0, 0), (0, 200, 0), (0, 0, 255)]


def screenshot(k: int) -> list:
    """Take a screenshot of screen k.

    Args:
        k: Which screen.
    """
    return [{"type": "image", "image": Image.new("RGB", (28, 28), SCREENS[k])}, {"type": "text", "text": "look"}]


def rounds(completions, **kwargs):
    """The number of messages of each rollout: rollouts with more tool rounds differ from the others."""
    return [float(len(c)) for c in completions]


@pytest.fixture(scope="module")
def vlm_dir(tmp_path_factory):
    from grpokit.testing.tiny_vlm import build_tiny_qwen2_vl

    folder = tmp_path_factory.mktemp("tiny-qwen2-vl")
    build_tiny_qwen2_vl(folder, words=["colour", "?", "look", "red", "blue"], image_side=28)
    return folder


def trainer_for(folder, run, rows, max_steps=2) -> GRPOTrainer:
    from grpokit.models.vision import load_processor

    args = GRPOConfig(
        output_dir=str(run), num_generations=4, per_device_train_batch_size=8, max_completion_length=16,
        max_steps=max_steps, learning_rate=1e-2, report_to="none", disable_tqdm=True, beta=0.04, save_strategy="no",
        seed=0, tool_parser=f"{TOOLS}:screenshot_every_other_turn", max_tool_calling_iterations=2, tool_workers=2,
    )  # fmt: skip
    return GRPOTrainer(
        model=str(folder), reward_funcs=rounds, args=args, train_dataset=rows,
        processing_class=load_processor(str(folder)), tools=[screenshot],
    )  # fmt: skip


def test_trains_with_a_tool_that_returns_an_image(vlm_dir, tmp_path):
    from transformers import AutoModelForImageTextToText

    folder, run = vlm_dir, tmp_path / "run"
    rows = [{"prompt": [{"role": "user", "content": "colour ?"}]}, {"prompt": [{"role": "user", "content": "look ?"}]}]
    trainer = trainer_for(folder, run, rows * 2)
    before = dict(AutoModelForImageTextToText.from_pretrained(folder).named_parameters())
    trainer.train()
    moved = {n for n, p in trainer.model.named_parameters() if not torch.equal(p.detach(), before[n].detach())}
    assert moved == {n for n, _ in trainer.model.named_parameters()}  # the vision tower too: it saw tool images

    shown = {image_hash(Image.new("RGB", (28, 28), rgb)): rgb for rgb in SCREENS}
    with RolloutStore(run, readonly=True) as store:
        stored = store.rollouts()
    named = {sha for r in stored for sha in r.get("images") or ()}
    assert named and named <= set(shown)  # each row names the tool images its completion showed, by hash
    tool_turns = [t for r in stored for t in r["conversation"]["turns"] if t["role"] == "tool"]
    assert {sha for t in tool_turns for sha in t.get("images", ())} == named
    for sha in named:  # kept once, as the PNG whose bytes hash to its name
        assert (run / "images" / f"{sha}.png").is_file()
        assert Image.open(run / "images" / f"{sha}.png").getpixel((0, 0)) == shown[sha]
    steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [s["tools/call_frequency"] > 0 for s in steps if "loss" in s] == [True, True]


def test_prompts_with_images_train_with_tools(vlm_dir, tmp_path):
    """A dataset's prompt images and a tool's: each rollout's images are its prompt's, then its tools', by hash."""
    run = tmp_path / "run"
    photo = Image.new("RGB", (20, 20), (9, 90, 9))
    rows = [{"prompt": [{"role": "user", "content": "colour ?"}], "image": photo}] * 2
    trainer_for(vlm_dir, run, rows, max_steps=1).train()
    with RolloutStore(run, readonly=True) as store:
        stored = store.rollouts()
    shown = {image_hash(Image.new("RGB", (28, 28), rgb)) for rgb in SCREENS}
    assert all(r["images"][0] == image_hash(photo) for r in stored)
    tools = [r["images"][1:] for r in stored]
    assert any(tools) and all(set(t) <= shown for t in tools)
    for r, t in zip(stored, tools):
        assert [sha for turn in r["conversation"]["turns"] for sha in turn.get("images", ())] == t
    assert (run / "images" / f"{image_hash(photo)}.png").is_file()


def test_prompts_with_images_and_tools_sample_through_a_patched_generate(vlm_dir, tmp_path, capsys):
    """TRL's way (``patch.object(trainer.model, "generate", ...)``, generation.engine: transformers from then on)
    with prompt images and an image tool: every generate call gets one image grid per image span of its rows (the
    prompt's first, then the tools'), so the prompt's image reaches generate, and the run trains and stores it."""
    from unittest.mock import patch

    from grpokit.compose.patched_generate import NOTE

    run = tmp_path / "run"
    photo = Image.new("RGB", (20, 20), (9, 90, 9))
    rows = [{"prompt": [{"role": "user", "content": "colour ?"}], "image": photo}] * 2
    trainer = trainer_for(vlm_dir, run, rows, max_steps=1)
    real, grids, image_id = trainer.model.generate, [], trainer.model.config.image_token_id

    def counted(**kwargs):
        ids = kwargs["input_ids"]  # [R, L]: count the rows' image spans (a placeholder run) against the grids
        starts = (ids == image_id) & ~torch.nn.functional.pad(ids == image_id, (1, -1), value=False)
        grids.append((int(starts.sum()), kwargs["image_grid_thw"].size(0), ids.size(0)))
        return real(**kwargs)

    with patch.object(trainer.model, "generate", side_effect=counted):
        trainer.train()
    assert capsys.readouterr().err.count(NOTE) == 1
    assert grids[0] == (8, 8, 8) and len(grids) >= 2  # 2 prompts x 4 generations, one photo each; then tool rounds
    assert all(spans == shown > rows_ for spans, shown, rows_ in grids[1:])  # the photo and >= 1 tool image a row
    with RolloutStore(run, readonly=True) as store:
        stored = store.rollouts()
    assert all(r["images"][0] == image_hash(photo) for r in stored) and any(r["images"][1:] for r in stored)
