"""examples/gsm8k end to end on a stand-in: the GSM8K-format data the example generates (standin.py, a save_to_disk
folder), its preparation (prepare.py), training with the CPU config shortened by overrides, `grpokit eval` on the
test split, `grpokit report`; the model is a tiny Qwen2-shaped one with Qwen's chat format, built here. Plus the
recipe's rewards on GSM8K-style completions and the answer extraction by hand."""

from __future__ import annotations

import importlib.util
import json
import sqlite3
from pathlib import Path

import pytest

from grpokit.cli import main
from grpokit.config import load_config

EXAMPLE = Path(__file__).parents[2] / "examples" / "gsm8k"
SYSTEM = "You are a careful math tutor."

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: see conftest.one_thread


def script(name: str):
    spec = importlib.util.spec_from_file_location(f"example_gsm8k_{name}", EXAMPLE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def tiny_qwen(tmp_path_factory):
    """A random-init 2-layer Qwen2 with a byte-level tokenizer and Qwen2.5's chat template (no hub)."""
    from grpokit.testing import build_tiny_causal_lm
    from grpokit.testing.tools import qwen_style_tokenizer

    path = tmp_path_factory.mktemp("tiny-qwen")
    build_tiny_causal_lm(path, qwen_style_tokenizer(), arch="qwen2", hidden_size=32, num_layers=2, num_heads=2)
    return path


def test_answer_extraction_by_hand():
    prepare = script("prepare")
    assert prepare.final_answer("She pays 3 * 400 = <<3*400=1200>>1200.\n#### 1,200") == "1200"
    assert prepare.final_answer("#### 5\nchecked: 5 + 0\n#### 7") == "7"  # the last #### line
    assert prepare.final_answer("no final line") is None
    rows, dropped = prepare.prepare_rows(
        [{"question": "q", "answer": "2 + 2 = <<2+2=4>>4\n#### 4"}, {"question": "r", "answer": "4"}]
    )
    assert rows == [{"question": "q", "answer": "4", "solution": "2 + 2 = <<2+2=4>>4"}] and dropped == 1
    assert prepare.split_source("hf:openai/gsm8k:main", "test") == {
        "path": "openai/gsm8k",
        "name": "main",
        "split": "test",
    }
    assert prepare.split_source("data/gsm8k-standin", "train") == {"path": "data/gsm8k-standin", "split": "train"}


def test_the_recipes_rewards_on_gsm8k_completions():
    """accuracy (math-verify) and the format reward as examples/gsm8k/cpu.yaml configures them."""
    from grpokit.rewards.resolve import resolve_reward

    cfg = load_config(EXAMPLE / "cpu.yaml")
    (_, accuracy, w_acc), (_, fmt, w_fmt) = (resolve_reward(spec) for spec in cfg.rewards)
    assert (w_acc, w_fmt) == (1.0, 0.1)
    completions = [
        "Tom has 3 + 4 = 7 apples.\n#### 7",  # right, GSM8K's layout
        "3 + 4 = 7, so the answer is 7.",  # right (the last number), no #### line
        "#### 7\nLet me double-check that.",  # right, but the #### line is not last
        "#### 8",  # wrong
        "#### 1,200",  # right against 1200: thousands commas
        "#### 0.5",  # right against 1/2: math-verify
    ]
    answers = ["7", "7", "7", "7", "1200", "\\frac{1}{2}"]
    assert accuracy([""] * 6, completions, answer=answers) == [1.0, 1.0, 1.0, 0.0, 1.0, 1.0]
    assert fmt([""] * 6, completions) == [1.0, 0.0, 0.0, 1.0, 1.0, 1.0]


@pytest.mark.slow
def test_the_recipe_end_to_end_on_the_stand_in(tmp_path, tiny_qwen, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    # 1. the stand-in: GSM8K-format word problems, a train / test DatasetDict written by save_to_disk
    assert script("standin").main(["data/gsm8k-standin", "--train", "96", "--test", "24"]) == {"train": 96, "test": 24}
    import datasets

    standin = datasets.load_from_disk("data/gsm8k-standin")
    assert standin.column_names == {"train": ["question", "answer"], "test": ["question", "answer"]}
    assert not set(standin["train"]["question"]) & set(standin["test"]["question"])

    # 2. preparation: the number after ####, local folders the configs read
    assert script("prepare").main(["--source", "data/gsm8k-standin", "--out", "data/gsm8k"]) == {
        "train": 96,
        "test": 24,
    }
    prepared = datasets.load_from_disk("data/gsm8k/test")
    assert prepared.column_names == ["question", "answer", "solution"]
    for raw, row in zip(standin["test"], prepared):
        assert raw["answer"].endswith(f"#### {row['answer']}") and row["solution"] == raw["answer"].rsplit("\n", 1)[0]

    # 3. training: the CPU config, shortened
    capsys.readouterr()
    short = [f"model_name_or_path={tiny_qwen}", "max_steps=2", "max_completion_length=24", "eval_steps=0"]
    assert main(["train", str(EXAMPLE / "cpu.yaml"), *short, "save_steps=1", "progress_bar=false"]) == 0
    run = tmp_path / "runs" / "gsm8k-cpu"
    steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if '"step"' in line]
    assert [s["step"] for s in steps] == [1, 2]
    assert {"rewards/accuracy/mean", "rewards/format/mean", "kl"} <= set(steps[-1])
    with sqlite3.connect(run / "rollouts.sqlite") as db:
        prompt = db.execute("SELECT prompt FROM rollouts LIMIT 1").fetchone()[0]
    # the prompt the config built: system prompt, the question in the template, Qwen's chat format
    assert prompt.startswith(f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n")
    assert prompt.endswith('on the last line after "####".<|im_end|>\n<|im_start|>assistant\n')
    assert any(question in prompt for question in datasets.load_from_disk("data/gsm8k/train")["question"])
    final = run / "final"
    assert (final / "adapter_config.json").is_file() and (final / "merged" / "config.json").is_file()

    # 4. evaluation on the test split: pass@1 and greedy accuracy of the trained adapter
    capsys.readouterr()
    assert main(["eval", str(run), "max_eval_prompts=8", "max_completion_length=24"]) == 0
    metrics = json.loads(capsys.readouterr().out)
    assert metrics["eval/num_prompts"] == 8.0
    assert 0.0 <= metrics["eval/pass@1"] <= 1.0 and 0.0 <= metrics["eval/greedy_accuracy"] <= 1.0

    # 5. the report
    (run / "report.html").unlink()
    assert main(["report", str(run)]) == 0
    assert "rewards/accuracy/mean" in (run / "report.html").read_text()
