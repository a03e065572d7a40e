"""Two real training runs of the tiny model with different settings, each evaluated on 6 held-out prompts before
and after: their reports have the Groups and Held-out views, and `grpokit compare` names the differing settings,
the final evaluations and the prompts one run solves and the other does not."""

from __future__ import annotations

import json
import re

import pytest
from shared_helpers import TARGET_REWARD, tiny_args

from grpokit import GRPOTrainer
from grpokit.cli import main
from grpokit.store.compare import load_run, solved_difference

pytestmark = pytest.mark.usefixtures("one_thread")


def train(tmp_path, name, tiny_model_dir, word_prompts, **settings):
    evaluation = dict(eval_steps=2, num_generations_eval=4, pass_at_k=[1, 4], success_threshold=0.2)
    args = tiny_args(tmp_path / name, **evaluation, **settings)
    GRPOTrainer(
        str(tiny_model_dir), TARGET_REWARD, args=args, train_dataset=word_prompts, eval_dataset=word_prompts[:6]
    ).train()
    return tmp_path / name


def test_compare_two_trained_runs(tmp_path, tiny_model_dir, word_prompts, capsys):
    a = train(tmp_path, "a", tiny_model_dir, word_prompts, learning_rate=1e-3, seed=1)
    b = train(tmp_path, "b", tiny_model_dir, word_prompts, learning_rate=1e-5, seed=2)
    html = (a / "report.html").read_text()
    assert re.findall(r'class="group-step" data-step="(\d+)"', html) == ["1", "2"]
    assert "eval: 6 prompts, 2 evaluations" in html  # before training and at step 2
    assert main(["compare", str(a), str(b), "-o", str(tmp_path / "compare.html")]) == 0
    text = capsys.readouterr().out
    assert "config difference:" in text
    diff = dict(
        line.strip().split(": ", 1) for line in text.split("config difference:\n")[1].split("final")[0].splitlines()
    )
    assert diff["optim.learning_rate"] == "0.001 | 1e-05" and diff["optim.seed"] == "1 | 2"
    logged = [json.loads(line) for line in (b / "metrics.jsonl").read_text().splitlines()]
    last_b = [m for m in logged if "eval/pass@1" in m][-1]["eval/pass@1"]
    assert re.search(rf"  eval/pass@1: [\d.]+ @ step 2 \| {last_b:.4g} @ step 2 \([+-][\d.e-]+\)", text)
    only_a, only_b = solved_difference(load_run(a), load_run(b))["eval"]
    assert f"held-out eval: {len(only_a)} solved by a only, {len(only_b)} by b only" in text
