"""TRL's way of scripting completions: ``patch.object(trainer.model, "generate", side_effect=fake)`` between building
a GRPOTrainer and train(). TRL samples with model.generate without vLLM, so grpokit samples through the replaced
generate too (generation.engine: transformers, chosen at train() when the config named no engine), with tools in
TRL's round loop: the first call has every rollout's row, the next only the rows that called a tool."""

from __future__ import annotations

import json
from unittest.mock import patch

import pytest
import torch
from shared_helpers import tiny_args

from grpokit import GRPOTrainer
from grpokit.compose.patched_generate import NOTE
from grpokit.testing import build_tiny_causal_lm
from grpokit.testing.tools import qwen_style_tokenizer

pytestmark = pytest.mark.usefixtures("one_thread")
END = "<|im_end|>"
CALL = '<tool_call>\n{"name": "multiply", "arguments": {"a": 6, "b": 7}}\n</tool_call>' + END


def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: The first factor.
        b: The second factor.
    """
    return a * b


def length_reward(completions, **kwargs):
    return [float(len(str(c))) for c in completions]


def tiny_chat_model():
    tokenizer = qwen_style_tokenizer()
    model, _ = build_tiny_causal_lm(
        None, tokenizer, arch="qwen2", hidden_size=32, num_layers=1, num_heads=2, max_positions=2048
    )
    return model, tokenizer


def rows(n: int = 4) -> list[dict]:
    return [{"prompt": [{"role": "user", "content": f"What is 6 times {7 + i}?"}]} for i in range(n)]


def fake_generate_for(tokenizer, sizes: list[int]):
    """TRL's test_train_with_tools fake: a call of 2 rows (1 prompt x 2 generations) writes a tool call in row 0 and
    an answer in row 1; a call of 1 row (the row that called the tool) answers. ``sizes`` gets each call's rows."""

    def encode(text: str) -> list[int]:
        return tokenizer.encode(text, add_special_tokens=False)

    def fake_generate(input_ids, **kwargs):
        sizes.append(input_ids.shape[0])
        if input_ids.shape[0] == 2:
            call, answer = encode(CALL), encode("I don't know any tool" + END)
            answer += [tokenizer.pad_token_id] * (len(call) - len(answer))  # padded after its end, as generate pads
            completion_ids = torch.tensor([call, answer])
        else:
            completion_ids = torch.tensor([encode("Done!" + END)] * input_ids.shape[0])
        return torch.cat([input_ids, completion_ids.to(input_ids.device)], dim=-1)

    return fake_generate


def test_tools_sample_through_a_patched_generate_as_in_trl(tmp_path, capsys):
    model, tokenizer = tiny_chat_model()
    args = tiny_args(
        tmp_path / "run", num_generations=2, prompts_per_step=1, max_completion_length=256, learning_rate=0.1
    )
    trainer = GRPOTrainer(
        model, length_reward, args=args, train_dataset=rows(), processing_class=tokenizer, tools=[multiply]
    )
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    sizes: list[int] = []
    with patch.object(trainer.model, "generate", side_effect=fake_generate_for(tokenizer, sizes)):
        trainer.train()
    assert sizes == [2, 1, 2, 1]  # per step: the first turns of both rollouts, then the one that called the tool
    last = trainer.state.log_history[-1]
    assert last["train_loss"] is not None
    assert last["tools/call_frequency"] == pytest.approx(1 / 2) and last["tools/failure_frequency"] == 0.0
    steps = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [m["tools/call_frequency"] for m in steps if "loss" in m] == [0.5, 0.5]
    moved = [n for n, p in trainer.model.named_parameters() if not torch.equal(p.detach(), before[n])]
    assert moved == [n for n, _ in trainer.model.named_parameters()]
    assert capsys.readouterr().err.count(NOTE) == 1


def test_single_turn_samples_through_a_patched_generate(tmp_path):
    model, tokenizer = tiny_chat_model()
    args = tiny_args(tmp_path / "run", num_generations=2, prompts_per_step=2, learning_rate=0.1)
    trainer = GRPOTrainer(model, length_reward, args=args, train_dataset=rows(), processing_class=tokenizer)
    real = trainer.model.generate
    sizes = []

    def counted(input_ids, **kwargs):
        sizes.append(input_ids.shape[0])
        return real(input_ids=input_ids, **kwargs)

    with patch.object(trainer.model, "generate", side_effect=counted):
        trainer.train()
    assert sizes == [4, 4]  # one call a step: 2 prompts x 2 generations, as TRL's _generate_single_turn


def test_a_named_engine_is_kept(tmp_path):
    """generation.engine: hf given explicitly: grpokit's own sampler, the patched generate is never called."""
    model, tokenizer = tiny_chat_model()
    args = tiny_args(tmp_path / "run", num_generations=2, prompts_per_step=1, max_steps=1, engine="hf")
    trainer = GRPOTrainer(model, length_reward, args=args, train_dataset=rows(), processing_class=tokenizer)
    with patch.object(trainer.model, "generate", side_effect=AssertionError("generate called")) as fake:
        trainer.train()
    assert fake.call_count == 0
