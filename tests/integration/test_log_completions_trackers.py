"""``log_completions`` end to end through GRPOTrainer: TRL's ``trainer._logs`` filled from each step's rollouts (a text
model with a ``log_extra`` column; a tiny Qwen2-VL with and without ``log_multimodal``), and the completions table
sent to W&B and trackio (stand-in modules recording the calls of the real API: ``wandb.init`` / ``run.log`` /
``wandb.Table`` / ``wandb.Image``; ``trackio.init`` / ``log`` / ``Table`` / ``Image``), with an image column only
with ``log_multimodal``. Without ``log_completions`` nothing is filled or sent."""

from __future__ import annotations

import sqlite3
import sys
import types

import pytest
from PIL import Image
from shared_helpers import TRL_STYLE, tiny_args, word_prompts

from grpokit import GRPOConfig, GRPOTrainer

pytestmark = pytest.mark.usefixtures("one_thread")
COLOURS = {"red": (255, 0, 0), "green": (0, 200, 0), "blue": (0, 0, 255)}


class Cell:
    """What a stand-in ``Image(value)`` / ``Table(columns=, data=)`` returns: its arguments."""

    def __init__(self, *args, **kwargs):
        self.args, self.kwargs = args, kwargs


def tracker_modules(calls: list) -> dict:
    wandb = types.ModuleType("wandb")
    run = types.SimpleNamespace(log=lambda data, step=None: calls.append(("wandb", data, step)), finish=lambda: None)
    wandb.init = lambda **kwargs: run
    trackio = types.ModuleType("trackio")
    trackio.init = lambda **kwargs: None
    trackio.log = lambda data, step=None: calls.append(("trackio", data, step))
    trackio.finish = lambda: None
    for module in (wandb, trackio):
        module.Table, module.Image = type("Table", (Cell,), {}), type("Image", (Cell,), {})
    return {"wandb": wandb, "trackio": trackio}


def tables(calls: list) -> dict:
    """{(tracker, step): (columns, rows)} of the completions tables logged."""
    return {(c[0], c[2]): (c[1]["completions"].kwargs["columns"], c[1]["completions"].kwargs["data"]) for c in calls
            if "completions" in c[1]}  # fmt: skip


def length_with_extra(completions, **kwargs):
    kwargs["log_extra"]("head", [c[:2] for c in completions])
    return [float(len(c)) for c in completions]


@pytest.mark.parametrize("log_completions", [True, False])
def test_logs_hold_the_last_steps_rollouts(tmp_path, tiny_model_dir, monkeypatch, log_completions):
    calls: list = []
    for name, module in tracker_modules(calls).items():
        monkeypatch.setitem(sys.modules, name, module)
    args = tiny_args(
        tmp_path / "run", **TRL_STYLE | {"report_to": ["jsonl", "wandb", "trackio"]}, log_completions=log_completions
    )
    trainer = GRPOTrainer(str(tiny_model_dir), length_with_extra, args=args, train_dataset=word_prompts(8, 3))
    trainer.train()
    logs = trainer._logs
    assert logs["prompt"].maxlen == 8  # 2 prompts x 4 completions a step: TRL's generation_batch_size
    if not log_completions:
        assert not logs["prompt"] and not logs["rewards"] and not logs["extra"] and not tables(calls)
        return
    with sqlite3.connect(tmp_path / "run" / "rollouts.sqlite") as db:
        last = db.execute(
            "SELECT completion, reward, advantage FROM rollouts WHERE step = 2 ORDER BY prompt_index, completion_index"
        ).fetchall()
    # the deques hold step 2's 8 rollouts (step 1's pushed out), in rollout order
    assert sorted(zip(logs["completion"], logs["rewards"]["length_with_extra"], logs["advantages"])) == sorted(last)
    assert list(logs["extra"]["head"]) == [c[:2] for c in logs["completion"]]
    rows = {r["prompt"] for r in word_prompts(8, 3)}
    assert set(logs["prompt"]) <= rows and len(logs["prompt"]) == 8
    for tracker in ("wandb", "trackio"):
        columns, data = tables(calls)[(tracker, 2)]
        assert columns == ["step", "prompt", "completion", "length_with_extra", "head", "advantage"]
        assert sorted(row[2] for row in data) == sorted(logs["completion"]) and {row[0] for row in data} == {2}
    assert {key[1] for key in tables(calls)} == {1, 2}  # logging_steps=1: a table each step


@pytest.fixture(scope="module")
def vlm_dir(tmp_path_factory):
    from grpokit.testing.tiny_vlm import build_tiny_qwen2_vl

    path = tmp_path_factory.mktemp("tiny-qwen2-vl")
    build_tiny_qwen2_vl(path, words=[*COLOURS, "colour", "?"], image_side=28)
    return path


def length_reward(completions, **kwargs):
    return [float(len(c[0]["content"])) for c in completions]


@pytest.mark.parametrize("log_multimodal", [True, False])
def test_images_in_logs_and_tables_only_with_log_multimodal(vlm_dir, tmp_path, monkeypatch, log_multimodal):
    from grpokit.models.vision import load_processor

    calls: list = []
    for name, module in tracker_modules(calls).items():
        monkeypatch.setitem(sys.modules, name, module)
    chat = [{"role": "user", "content": "colour ?"}]
    rows = [{"prompt": chat, "image": Image.new("RGB", (30, 30), rgb)} for rgb in COLOURS.values()] * 2
    args = GRPOConfig(
        output_dir=str(tmp_path / "run"), num_generations=2, per_device_train_batch_size=4, max_completion_length=3,
        max_steps=1, report_to=["wandb", "trackio"], disable_tqdm=True, log_completions=True, logging_steps=1,
        log_multimodal=log_multimodal,
    )  # fmt: skip
    trainer = GRPOTrainer(
        str(vlm_dir), length_reward, args=args, train_dataset=rows, processing_class=load_processor(vlm_dir)
    )
    trainer.train()
    logs = trainer._logs
    assert len(logs["prompt"]) == 4 and all(p == chat for p in logs["prompt"])
    assert all(c[0]["role"] == "assistant" for c in logs["completion"])  # conversational: as the rewards got them
    for tracker in ("wandb", "trackio"):
        columns, data = tables(calls)[(tracker, 1)]
        assert columns[-1] == ("image" if log_multimodal else "advantage")
    if not log_multimodal:
        assert len(logs["images"]) == 0  # TRL's test_train_vlm_log_multimodal_false
        return
    assert len(logs["images"]) == 4 and all(len(images) == 1 for images in logs["images"])
    colours = {images[0].convert("RGB").getpixel((0, 0)) for images in logs["images"]}
    assert colours <= set(COLOURS.values())  # the prompts' own pictures
    for tracker in ("wandb", "trackio"):
        columns, data = tables(calls)[(tracker, 1)]
        assert columns[-1] == "image"  # one image a prompt: no image_2 for W&B
        for row in data:  # trackio: a list of its Image per cell, as TRL; W&B: one wandb.Image per cell
            [cell] = row[-1] if tracker == "trackio" else [row[-1]]
            assert type(cell).__name__ == "Image" and isinstance(cell.args[0], Image.Image)
            assert cell.args[0].convert("RGB").getpixel((0, 0)) in COLOURS.values()
