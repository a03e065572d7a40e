"""Inputs that can only be judged with the tokenizer: a tokenizer without a pad token, prompts longer
than max_prompt_length, chat prompts for a tokenizer without a chat template."""

from __future__ import annotations

import functools
import json

import pytest
from shared_helpers import WORDS, tiny_args, tiny_run_config

from grpokit import GRPOTrainer
from grpokit.cli import main
from grpokit.testing import build_tiny_causal_lm, build_word_tokenizer


def word_count(prompts, completions, **columns):
    return [float(len(c.split())) for c in completions]


args = functools.partial(tiny_args, num_generations=2, max_steps=1, max_completion_length=3, beta=0.0)


def metrics(tmp_path) -> dict:
    return json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[-1])


def test_a_tokenizer_without_pad_token_pads_with_eos(tmp_path):
    tokenizer = build_word_tokenizer(WORDS)
    tokenizer.pad_token = None
    model_dir = tmp_path / "model"
    build_tiny_causal_lm(model_dir, tokenizer, hidden_size=16, num_layers=1, num_heads=2)
    # prompts of different lengths, so a step's batch really is padded
    prompts = [{"prompt": " ".join(WORDS[: 2 + i % 3])} for i in range(4)]
    trainer = GRPOTrainer(str(model_dir), word_count, args=args(tmp_path / "run"), train_dataset=prompts)
    assert trainer.tokenizer.pad_token_id == trainer.tokenizer.eos_token_id
    trainer.train()
    assert metrics(tmp_path)["nonfinite"] == 0.0


@pytest.mark.parametrize("overflow, counted", [("truncate", "prompts_truncated"), ("drop", "prompts_dropped")])
def test_long_prompts_are_counted_in_the_metrics(tmp_path, tiny_model_dir, overflow, counted):
    # 3 of the 6 prompts have 5 words, more than max_prompt_length = 3 tokens
    prompts = [{"prompt": " ".join(WORDS[i : i + (5 if i % 2 else 2)])} for i in range(6)]
    GRPOTrainer(
        str(tiny_model_dir),
        word_count,
        args=args(tmp_path / "run", max_prompt_length=3, prompt_overflow=overflow),
        train_dataset=prompts,
    ).train()
    logged = metrics(tmp_path)
    assert logged[counted] == 3.0
    assert logged["prompts_truncated" if overflow == "drop" else "prompts_dropped"] == 0.0


def write_cli_run(tmp_path, model_dir, rows, **data) -> str:
    reward = f"{__file__}:word_count"
    return str(
        tiny_run_config(tmp_path, model_dir, max_steps=1, num_generations=2, rewards=[reward], prompts=rows, data=data)
    )


def test_prompt_overflow_error_exits_2_naming_the_prompt(tmp_path, tiny_model_dir, capsys):
    rows = [{"prompt": "w1 w2"}, {"prompt": " ".join(WORDS[:8])}]
    assert (
        main(["train", write_cli_run(tmp_path, tiny_model_dir, rows, max_prompt_length=4, prompt_overflow="error")])
        == 2
    )
    assert "prompt 1 has 8 tokens, more than max_prompt_length=4" in capsys.readouterr().err


def test_chat_prompts_need_a_chat_template(tmp_path, capsys):
    tokenizer = build_word_tokenizer(WORDS)
    model_dir = tmp_path / "model"
    build_tiny_causal_lm(model_dir, tokenizer, hidden_size=16, num_layers=1, num_heads=2)
    rows = [{"prompt": [{"role": "user", "content": f"w{i} w2"}]} for i in range(4)]
    assert main(["train", write_cli_run(tmp_path, model_dir, rows)]) == 2
    assert "a prompt is a list of chat messages but the tokenizer has no chat_template" in capsys.readouterr().err
