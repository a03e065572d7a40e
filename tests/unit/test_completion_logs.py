"""TRL's ``trainer._logs`` layout (grpokit/trl/completion_logs.py), against values worked out by hand."""

from __future__ import annotations

import math
from collections import deque

from PIL import Image

from grpokit.store.record import RolloutRecord
from grpokit.trl.completion_logs import add_records, completion_logs


def record(n: int, completion: str, rewards: dict, advantage, extra=None, image_sources=None) -> RolloutRecord:
    return RolloutRecord(
        prompt_index=n // 2, completion_index=n % 2, prompt=f"rendered {n // 2}", completion=completion,
        prompt_tokens=3, completion_tokens=2, finish_reason="stop", rewards=rewards, reward=0.0,
        advantage=advantage, policy_version=0, extra=extra, image_sources=image_sources,
    )  # fmt: skip


def test_layout_is_trls():
    logs = completion_logs(4)
    assert set(logs) == {"images", "prompt", "completion", "rewards", "advantages", "extra"}
    assert all(isinstance(logs[k], deque) and logs[k].maxlen == 4 for k in ("images", "prompt", "advantages"))
    assert logs["rewards"]["any"].maxlen == 4 and logs["extra"]["col"].maxlen == 4  # defaultdicts of deques


def test_one_step_by_hand():
    logs = completion_logs(4)
    chat = [{"role": "user", "content": "w1 w2"}]
    records = [
        record(0, "a b", {"len": 3.0, "fmt": None}, 0.5, extra={"col": "x"}),  # fmt did not apply: NaN, as TRL
        record(1, "c", {"len": 1.0, "fmt": 1.0}, -0.5),  # logged no "col": None in that column
        record(2, "d e f", {"len": 5.0, "fmt": 0.0}, None),  # a dropped group: no advantage, NaN
        record(3, "g", {"len": 1.0, "fmt": 0.0}, 0.0, extra={"col": "y", "other": 7}),
    ]
    add_records(logs, records, ["plain 0", "plain 0", chat, chat], ["len", "fmt"], log_multimodal=True)
    assert list(logs["prompt"]) == ["plain 0", "plain 0", chat, chat]
    # a conversational prompt's completion is one assistant message, as TRL's reward functions get it
    assert list(logs["completion"]) == [
        "a b",
        "c",
        [{"role": "assistant", "content": "d e f"}],
        [{"role": "assistant", "content": "g"}],
    ]
    assert list(logs["rewards"]["len"]) == [3.0, 1.0, 5.0, 1.0]
    fmt = list(logs["rewards"]["fmt"])
    assert math.isnan(fmt[0]) and fmt[1:] == [1.0, 0.0, 0.0]
    adv = list(logs["advantages"])
    assert adv[:2] == [0.5, -0.5] and math.isnan(adv[2]) and adv[3] == 0.0
    assert dict(logs["extra"]) == {"col": deque(["x", None, None, "y"]), "other": deque([None, None, None, 7])}
    assert len(logs["images"]) == 0  # a text step adds no images (TRL: images is None for it)


def test_maxlen_keeps_the_latest_batch():
    logs = completion_logs(2)
    for step in range(3):  # steps of 2 completions: the deques hold step 2's only
        rows = [record(n, f"s{step}c{n}", {"r": float(10 * step + n)}, float(n)) for n in range(2)]
        add_records(logs, rows, ["p", "p"], ["r"], log_multimodal=True)
    assert list(logs["completion"]) == ["s2c0", "s2c1"] and list(logs["rewards"]["r"]) == [20.0, 21.0]


def test_images_only_with_log_multimodal():
    red, blue = Image.new("RGB", (4, 4), "red"), Image.new("RGB", (4, 4), "blue")
    rows = [record(0, "a", {"r": 1.0}, 0.0, image_sources=[red, blue]), record(1, "b", {"r": 0.0}, 0.0)]
    off = completion_logs(4)
    add_records(off, rows, ["p", "q"], ["r"], log_multimodal=False)
    assert len(off["images"]) == 0 and len(off["prompt"]) == 2
    on = completion_logs(4)
    add_records(on, rows, ["p", "q"], ["r"], log_multimodal=True)
    assert list(on["images"]) == [[red, blue], []]  # one list per completion, as TRL's (empty: no image)
