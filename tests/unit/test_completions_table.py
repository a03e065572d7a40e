"""The trackers' completions table (grpokit/train/completions_table.py), against rows written out by hand."""

from __future__ import annotations

import types

from PIL import Image

from grpokit.store.record import RolloutRecord
from grpokit.train.completions_table import completion_table, tracker_table


def record(n: int, rewards: dict, advantage, extra=None, image_sources=None) -> RolloutRecord:
    return RolloutRecord(
        prompt_index=0, completion_index=n, prompt="p", completion=f"c{n}", prompt_tokens=1, completion_tokens=1,
        finish_reason="stop", rewards=rewards, reward=0.0, advantage=advantage, policy_version=0, extra=extra,
        image_sources=image_sources,
    )  # fmt: skip


RED = Image.new("RGB", (2, 2), "red")
RECORDS = [
    record(0, {"a": 1.0, "b": None}, 0.5, extra={"x": "hi"}, image_sources=[RED]),
    record(1, {"a": 0.0, "b": 2.0}, -0.5),
]


def test_rows_by_hand():
    columns, rows = completion_table(RECORDS, 3, images=False)
    assert columns == ["step", "prompt", "completion", "a", "b", "x", "advantage"]
    assert rows == [[3, "p", "c0", 1.0, None, "hi", 0.5], [3, "p", "c1", 0.0, 2.0, None, -0.5]]


def test_image_column_with_log_multimodal_only_when_a_prompt_has_images():
    columns, rows = completion_table(RECORDS, 3, images=True)
    assert columns[-1] == "image" and [row[-1] for row in rows] == [[RED], []]
    text_only = [record(0, {"a": 1.0}, 0.0)]
    assert completion_table(text_only, 1, images=True)[0][-1] == "advantage"


def test_tracker_table_wraps_images_in_the_trackers_image():
    made = []
    module = types.SimpleNamespace(
        Image=lambda image: ("Image", image), Table=lambda **kwargs: made.append(kwargs) or "table"
    )
    columns, rows = completion_table(RECORDS, 3, images=True)
    assert tracker_table(module, columns, rows) == "table"
    [kwargs] = made
    assert kwargs["columns"] == columns and kwargs["allow_mixed_types"] is True
    assert [row[-1] for row in kwargs["data"]] == [[("Image", RED)], []]
    assert [row[:-1] for row in kwargs["data"]] == [row[:-1] for row in rows]  # the other cells untouched


def test_wandb_gets_one_image_per_cell():
    """W&B: one wandb.Image per cell, in image, image_2 ..., None past a prompt's last image."""
    made = []
    module = types.SimpleNamespace(Image=lambda image: ("Image", image), Table=lambda **kwargs: made.append(kwargs))
    blue = Image.new("RGB", (2, 2), "blue")
    records = [record(0, {"a": 1.0}, 0.5, image_sources=[RED, blue]), record(1, {"a": 0.0}, -0.5)]
    columns, rows = completion_table(records, 1, images=True)
    tracker_table(module, columns, rows, image_lists=False)
    [kwargs] = made
    assert kwargs["columns"] == ["step", "prompt", "completion", "a", "advantage", "image", "image_2"]
    assert [row[-2:] for row in kwargs["data"]] == [[("Image", RED), ("Image", blue)], [None, None]]
