"""Per-token values through the CLI on the tiny model: kept only when run.store_token_values asks, as the learner
computed them (the loss's numbers unchanged), shown by the report's Tokens view and by `grpokit inspect`, and absent
(without an error) from a store that has none."""

from __future__ import annotations

import json
import math
import re
import sqlite3

import pytest
from shared_helpers import tiny_run_config

from grpokit.cli import main
from grpokit.store import RolloutStore
from grpokit.store.token_values import TOKEN_VALUES

CLOCKS = re.compile(r"^time/|_time$|second|^memory/")  # wall times and memory: not the same in two runs


def train(tmp_path, model_dir, name: str, **run) -> list[dict]:
    config = tiny_run_config(tmp_path, model_dir, max_steps=2, name=name, run=run)
    assert main(["train", str(config)]) == 0
    return [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tiny_model_dir):
    tmp = tmp_path_factory.mktemp("tokens")
    plain = train(tmp, tiny_model_dir, "plain")
    kept = train(tmp, tiny_model_dir, "kept", store_token_values=["all"])
    return tmp, plain, kept


def test_values_are_kept_for_every_trained_token_and_change_no_number(runs):
    tmp, plain, kept = runs
    for before, after in zip(plain, kept):  # the same seed: every number but the clocks' is the same
        same = {k: v for k, v in before.items() if not CLOCKS.search(k)}
        assert {k: after[k] for k in same} == same
    with RolloutStore(tmp / "kept", readonly=True) as store:
        values = store.token_values()
        rollouts = store.rollouts()
    assert len(values) == len(rollouts) == 16  # 2 steps x 2 prompts x G = 4, all trained on
    by_key = {(r["step"], r["prompt_index"], r["completion_index"]): r for r in rollouts}
    for item in values:
        rollout = by_key[item["step"], item["prompt_index"], item["completion_index"]]
        n = rollout["completion_tokens"]
        assert len(item["tokens"]) == n  # each token decoded on its own, the special ones too (the completion not)
        words = [t for t in item["tokens"] if not (t.startswith("<") and t.endswith(">"))]  # special: not in it
        assert " ".join(words) == rollout["completion"]
        for name in TOKEN_VALUES:
            assert len(item[name]) == n, name
        assert all(v <= 0 for v in item["logprob"]) and all(v >= 0 for v in item["entropy"])
        # the hf engine samples with the learner's own weights: the gap is float noise (float16 keeps it)
        assert all(abs(v) < 1e-2 for v in item["gap"])
        # on-policy, one update per batch: ratio 1, nothing clipped, every completion token weighs 1
        assert item["weight"] == [1.0] * n
    # the mean of the stored log-probs is the logged completion_logprob_mean (float16: 3 digits)
    step1 = [v for item in values if item["step"] == 1 for v in item["logprob"]]
    assert math.isclose(sum(step1) / len(step1), kept[0]["completion_logprob_mean"], rel_tol=2e-3, abs_tol=2e-3)


def test_a_run_without_the_setting_stores_none_and_reads_back_empty(runs):
    tmp, _, _ = runs
    with RolloutStore(tmp / "plain", readonly=True) as store:
        assert store.token_values() == []
    page = (tmp / "plain" / "report.html").read_text()
    assert '<section id="tokens"' in page and "store_token_values" in page  # the view says how to get them


def test_an_old_store_without_the_table_opens_everywhere(runs, capsys):
    tmp, _, _ = runs
    old = tmp / "old"
    old.mkdir()
    (old / "rollouts.sqlite").write_bytes((tmp / "plain" / "rollouts.sqlite").read_bytes())
    with sqlite3.connect(old / "rollouts.sqlite") as conn:
        conn.execute("DROP TABLE token_values")
    with RolloutStore(old, readonly=True) as store:
        assert store.token_values() == []
    assert main(["inspect", str(old), "--tokens"]) == 0
    assert "no per-token values" in capsys.readouterr().out
    assert main(["report", str(old)]) == 0


def test_report_colours_the_tokens_without_javascript(runs):
    tmp, _, _ = runs
    page = (tmp / "kept" / "report.html").read_text()
    section = page[page.index('<section id="tokens"') :]
    section = section[: section.index("</section>")]
    assert section.count('class="tok"') > 0 and "background:" in section
    for name in TOKEN_VALUES:
        assert f'value="{name}"' in section  # the selector's options


def test_inspect_prints_a_completions_tokens_with_their_values(runs, capsys):
    tmp, _, _ = runs
    assert main(["inspect", str(tmp / "kept"), "--tokens", "--step", "2"]) == 0
    out = capsys.readouterr().out
    assert "logprob" in out and "gap" in out and "weight" in out and "step 2" in out


def test_a_resume_checks_and_keeps_the_per_token_values(tmp_path, tiny_model_dir, capsys):
    # the checkpoint records the store's digest chain, per-token rows included; the resume recomputes it from the
    # file, drops the rows after the checkpoint's step, and writes them again
    run = {"store_token_values": ["gap", "weight"], "save_steps": 1}
    config = tiny_run_config(tmp_path, tiny_model_dir, max_steps=2, run=run)
    assert main(["train", str(config)]) == 0
    assert main(["train", str(config), "resume_from=latest", "max_steps=3"]) == 0
    with RolloutStore(tmp_path / "run", readonly=True) as store:
        values = store.token_values()
        assert store.token_value_names() == ["gap", "weight"]
    assert sorted({v["step"] for v in values}) == [1, 2, 3] and len(values) == 24
    with sqlite3.connect(tmp_path / "run" / "rollouts.sqlite") as conn:  # a changed value: the resume refuses
        conn.execute("UPDATE token_values SET gap = weight WHERE step = 2")
    checkpoint = tmp_path / "run" / "checkpoints" / "step-2"
    assert main(["train", str(config), f"resume_from={checkpoint}", "max_steps=3"]) == 2
    assert "does not hold what checkpoint" in capsys.readouterr().err
