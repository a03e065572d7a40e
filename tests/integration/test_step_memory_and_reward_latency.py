"""Through the CLI on the tiny model: every step logs the process's peak memory and each reward function's time, in
metrics.jsonl and the store, and the report draws them in the Memory and Reward latency panels."""

from __future__ import annotations

import json
import re

from shared_helpers import TARGET_REWARD, tiny_run_config

from grpokit.cli import main
from grpokit.store import RolloutStore


def test_memory_and_reward_seconds_per_step_and_their_panels(tmp_path, tiny_model_dir):
    rewards = [TARGET_REWARD, {"name": "format", "pattern": "w.*"}]
    config = tiny_run_config(tmp_path, tiny_model_dir, max_steps=3, rewards=rewards)
    assert main(["train", str(config)]) == 0
    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [line for line in lines if "loss" in line]
    assert len(steps) == 3
    for line in steps:
        assert 0 < line["memory/peak_rss_gib"] < 1024
        assert line["rewards/target_fraction/seconds"] >= 0 and line["rewards/format/seconds"] >= 0
    peaks = [line["memory/peak_rss_gib"] for line in steps]
    assert peaks == sorted(peaks)  # a peak so far never falls
    with RolloutStore(tmp_path / "run", readonly=True) as store:
        stored = store.metrics()
    assert all("memory/peak_rss_gib" in row and "rewards/format/seconds" in row for row in stored)
    page = (tmp_path / "run" / "report.html").read_text()
    titles = re.findall(r'class="title">(.*?)</text>', page)
    assert "Memory (GiB)" in titles and "Reward latency (s): scoring time per step" in titles
    data = json.loads(re.search(r'id="grpokit-data">(.*?)</script>', page).group(1))
    assert set(data["Reward latency (s): scoring time per step"]) == {
        "rewards/target_fraction/seconds",
        "rewards/format/seconds",
        "time/reward",  # the scoring phase: every function, at once
    }
    assert set(data["Memory (GiB)"]) == {"memory/peak_rss_gib"}
