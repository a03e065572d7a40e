"""Per-token values: the loss weight's formula by hand, the policy loss unchanged when it reports them, float16 blobs,
the store's table (write, read, resume truncation, digest), the setting's check, the report's colour scale."""

from __future__ import annotations

import math
import sqlite3

import pytest
import torch
from shared_helpers import loss_spec

from grpokit.algos.losses import policy_loss, token_weights
from grpokit.config import GRPOConfig
from grpokit.errors import ConfigError
from grpokit.store import RolloutRecord, RolloutStore
from grpokit.store.integrity import step_digest
from grpokit.store.token_values import decode, encode
from grpokit.store.tokens import colour


def test_token_weights_by_hand():
    # two sequences of three tokens; the second's last token is padding
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    clipped = torch.tensor([[False, True, False], [False, False, False]])
    kept = torch.tensor([[1.0], [0.0]])  # the off-policy mask drops sequence 2
    is_weights = torch.tensor([[0.5, 2.0, 1.0], [1.0, 1.0, 1.0]])
    # w = m (1 - c) o s: [1*1*1*0.5, 1*0*1*2, 1*1*1*1] and sequence 2 all 0
    assert token_weights(mask, clipped, kept, None, is_weights).tolist() == [[0.5, 0.0, 1.0], [0.0, 0.0, 0.0]]
    # sequence level: one clip flag per sequence [N, 1] spreads over its tokens
    assert token_weights(mask, torch.tensor([[True], [False]])).tolist() == [[0.0, 0.0, 0.0], [1.0, 1.0, 0.0]]
    assert token_weights(mask).tolist() == mask.tolist()


def test_policy_loss_reports_the_clipped_tokens_and_changes_nothing():
    # ratio = exp(logp - old): token 0 at 1.5 with A = +1 (above 1 + 0.2: clipped high), token 1 at 1.0
    old = torch.zeros(2, 2)
    logp = torch.tensor([[math.log(1.5), 0.0], [math.log(0.5), 0.0]], requires_grad=True)
    advantages = torch.tensor([1.0, -1.0])  # sequence 2: ratio 0.5 < 0.8 with A < 0: clipped low
    mask = torch.ones(2, 2)
    spec = loss_spec()
    plain, plain_metrics = policy_loss(logp, old, advantages, mask, spec)
    out: list = []
    loss, metrics = policy_loss(logp, old, advantages, mask, spec, weights_out=out)
    assert loss.item() == plain.item() and metrics == plain_metrics
    assert out[0].tolist() == [[0.0, 1.0], [0.0, 1.0]]
    assert metrics["clip_ratio/region_mean"] == 0.5  # the same two tokens of four
    # a loss that clips nothing (cispo weighs its cap into the weight): only the masks count
    out = []
    policy_loss(logp, old, advantages, mask, loss_spec(loss_type="cispo", epsilon_high=5.0), weights_out=out)
    assert out[0].tolist() == [[1.0, 1.0], [1.0, 1.0]]


def test_float16_blobs():
    blob = encode([0.0, -1.5, 1e6, float("nan"), -0.333])
    assert len(blob) == 10  # 2 bytes a value
    back = decode(blob)
    assert back[:3] == [0.0, -1.5, 65504.0] and math.isnan(back[3]) and abs(back[4] + 0.333) < 1e-3
    assert decode(None) is None


def record(i: int, per_token=None) -> RolloutRecord:
    return RolloutRecord(i // 2, i % 2, "p", "a b", 1, 2, "stop", {"r": 1.0}, 1.0, 0.0, 0, per_token=per_token)


def test_store_writes_reads_and_truncates_token_values(tmp_path):
    values = {"tokens": ["a", " b"], "logprob": encode([-0.5, -2.0]), "weight": encode([1.0, 0.0])}
    with RolloutStore(tmp_path) as store:
        store.write_step(1, [record(0, values), record(1)], {})
        store.write_step(2, [record(0, values)], {})
        digest = store.step_digest(1)
        assert store.token_value_names() == ["logprob", "weight"]
        rows = store.token_values(1)
        assert len(rows) == 1 and rows[0]["tokens"] == ["a", " b"] and rows[0]["logprob"] == [-0.5, -2.0]
        assert rows[0]["gap"] is None and rows[0]["weight"] == [1.0, 0.0]
        store.rollback_after(1)
        assert [r["step"] for r in store.token_values()] == [1]
    with sqlite3.connect(tmp_path / "rollouts.sqlite") as conn:  # a changed value changes the step's digest
        conn.execute("UPDATE token_values SET logprob = ? WHERE step = 1", (encode([-0.5, -2.5]),))
        assert step_digest(conn, 1) != digest
        conn.execute("DELETE FROM token_values")  # a step without values digests as before they existed
        conn.execute("DROP TABLE token_values")
        plain = step_digest(conn, 1)
    with RolloutStore(tmp_path, readonly=True) as store:  # an old store: no table, nothing to read
        assert store.token_values() == [] and store.token_value_names() == []
    with RolloutStore(tmp_path) as store:  # opened for writing: the table comes back, the digest does not move
        assert store.step_digest(1) == plain


def test_setting_names_values_or_all():
    assert GRPOConfig(store_token_values=["all"]).run.kept_token_values() == ("logprob", "gap", "entropy", "weight")
    assert GRPOConfig(store_token_values=["weight", "gap"]).run.kept_token_values() == ("gap", "weight")
    with pytest.raises(ConfigError, match="store_token_values contains 'ratio'; valid values are logprob, gap"):
        GRPOConfig(store_token_values=["ratio"]).validate()


def test_colour_scales():
    assert colour("logprob", 0.0, 5.0) == "rgb(255,255,255)"
    assert colour("logprob", -10.0, 5.0) == "rgb(214,39,40)"  # beyond -5: full red
    assert colour("gap", -0.05, 0.1) == "rgb(143,187,218)"  # half way to blue: 255 + (31 - 255) / 2 = 143
    assert colour("weight", 0.0, 1.0) == "rgb(150,150,150)" and colour("weight", 1.0, 1.0) == "rgb(255,255,255)"
    assert colour("entropy", None, 1.0) == colour("gap", float("nan"), 1.0) == "rgb(238,238,238)"


def test_view_shows_first_middle_last_step_and_the_telling_completions(tmp_path):
    import re
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
    from synthetic_run import write_synthetic_run

    from grpokit.store.tokens import tokens_html

    run = write_synthetic_run(tmp_path / "run", steps=30, groups=4, group_size=6, token_values=True)
    with RolloutStore(run, readonly=True) as store:
        page = tokens_html(store)
        asked = tokens_html(store, [3, 4, 99])
        step16 = store.token_values(16)
        rewards = {(r["prompt_index"], r["completion_index"]): r["reward"] for r in store.rollouts(step=16)}
    assert re.findall(r"<h3>Step (\d+)</h3>", page) == ["1", "16", "30"]  # first, middle, last
    assert re.findall(r"<h3>Step (\d+)</h3>", asked) == ["3", "4"]  # --steps: those with values
    block = page[page.index("<h3>Step 16</h3>") : page.index("<h3>Step 30</h3>")]
    shown = {(int(p), int(c)) for p, c in re.findall(r"step 16 · prompt (\d+) · #(\d+)", block)}
    assert 1 <= len(shown) <= 4
    largest_gap = max(step16, key=lambda v: max(abs(g) for g in v["gap"]))
    least_weight = min(step16, key=lambda v: sum(v["weight"]) / len(v["weight"]))
    for item in (largest_gap, least_weight):
        assert (item["prompt_index"], item["completion_index"]) in shown
    assert max(rewards.values()) in {rewards[key] for key in shown}
    assert min(rewards.values()) in {rewards[key] for key in shown}
