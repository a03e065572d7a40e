"""examples/tools: the calculator tool, the task, the chat format, and a shortened run that must learn."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).parents[2] / "examples" / "tools"
MODULES = ("calculator", "chat_format", "measure", "warm_start")


@pytest.fixture()
def example():
    """Import examples/tools/run.py (which puts its folder on sys.path); afterwards restore sys.path, the
    thread count and drop the example's modules."""
    saved_path, threads = list(sys.path), torch.get_num_threads()
    spec = importlib.util.spec_from_file_location("example_tools_run", HERE / "run.py")
    module = sys.modules[spec.name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    yield module
    sys.path[:] = saved_path
    for name in (spec.name, *MODULES):
        sys.modules.pop(name, None)
    torch.set_num_threads(threads)


def test_calculator_is_safe_arithmetic(example):
    from calculator import calculator

    assert calculator("47*86") == "4042"
    assert calculator(" (3+4)*2 - 10//3 ") == "11"  # 14 - 3
    assert calculator("7/2") == "3.5" and calculator("8/2") == "4" and calculator("-3*-3") == "9"
    for bad, why in (
        ("__import__('os').system('true')", "unsupported expression element Call"),
        ("x*2", "unsupported expression element Name"),
        ("2**8", "unsupported operator Pow"),
        ("9" * 20 + "*" + "9" * 20, "more than 30 digits"),
        ("4*", "not an arithmetic expression"),
    ):
        with pytest.raises(ValueError, match=why):
            calculator(bad)


def test_task_splits_and_reward(example):
    from calculator import answer_correct, splits

    hard, held_out, easy = splits(n_eval=200)
    assert len(hard) + len(held_out) == 90 * 90 and len(held_out) == 200 and len(easy) == 100
    question = lambda rows: {r["prompt"][0]["content"] for r in rows}
    assert not question(hard) & question(held_out)
    assert splits(n_eval=200)[1] == held_out  # seeded: the same split every time
    row = next(r for r in held_out)
    a, b = (int(x) for x in row["prompt"][0]["content"][len("What is ") : -1].split("*"))
    assert row["answer"] == str(a * b) and row["kind"] == "hard"

    call = {"type": "function", "function": {"name": "calculator", "arguments": {"expression": "47*86"}}}
    with_tool = [
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "name": "calculator", "content": "4042"},
        {"role": "assistant", "content": "4042"},
    ]
    completions = [
        with_tool,
        [{"role": "assistant", "content": " 4042 "}],  # by heart, right
        [{"role": "assistant", "content": "4042 is it"}],  # not the number alone
        with_tool[:2],  # called, never answered
        [{"role": "assistant", "content": "4041"}],
    ]
    logged = {}
    rewards = answer_correct(
        [[]] * 5, completions, ["4042"] * 5, log_metric=lambda name, value: logged.update({name: value})
    )
    assert rewards == [1.0, 1.0, 0.0, 0.0, 0.0]
    assert logged == {"tool_use": 2 / 5}


def test_chat_format_renders_a_tool_round_as_the_rollout_tokens(example):
    from calculator import calculator
    from chat_format import tool_tokenizer

    from grpokit.tools import ConversationTokens, parse_tool_calls, tool_parser_for, tool_schemas

    tokenizer = tool_tokenizer()
    chat = ConversationTokens(tokenizer)
    assert tool_parser_for(tokenizer) == "hermes" and chat.end_of_turn == tokenizer.eos_token_id
    schemas = tool_schemas([calculator])
    prompt = [{"role": "user", "content": "What is 47*86?"}]
    turn = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "47*86"}}\n</tool_call>'
    conversation = chat.start(prompt, schemas)
    conversation.add_generated([*tokenizer.encode(turn, add_special_tokens=False), chat.end_of_turn])
    chat.add_tool_results(conversation, [{"role": "tool", "name": "calculator", "content": "4042"}])
    conversation.add_generated([*tokenizer.encode("4042", add_special_tokens=False), chat.end_of_turn])
    call = parse_tool_calls(turn, "hermes")[0]
    assert (call.name, call.arguments, call.error) == ("calculator", {"expression": "47*86"}, None)

    messages = [
        *prompt,
        {"role": "assistant", "content": "", "tool_calls": [call.as_message_call()]},
        {"role": "tool", "name": "calculator", "content": "4042"},
        {"role": "assistant", "content": "4042"},
    ]
    text = tokenizer.apply_chat_template(messages, tools=schemas, tokenize=False)
    assert text == (
        "<|im_start|>system\nTools: calculator<|im_end|>\n<|im_start|>user\nWhat is 47*86?<|im_end|>\n"
        f"<|im_start|>assistant\n{turn}<|im_end|>\n"
        "<|im_start|>user\n<tool_response>\n4042\n</tool_response><|im_end|>\n<|im_start|>assistant\n4042<|im_end|>\n"
    )
    # the conversation built turn by turn is the rendered one (without its final newline), and the model's
    # tokens are exactly the call and the answer with their end-of-turn tokens: 27 + 1 and 4 + 1
    ids = tokenizer.apply_chat_template(messages, tools=schemas, tokenize=True, return_dict=False)
    assert conversation.ids == list(ids)[:-1]
    assert sum(conversation.mask) == 33
    model_tokens = [i for i, m in zip(conversation.ids, conversation.mask) if m]
    assert tokenizer.decode(model_tokens) == f"{turn}<|im_end|>4042<|im_end|>"


@pytest.mark.slow
def test_tools_example_learns_to_call_the_calculator(tmp_path, example):
    """A shortened run of the README's command: a shorter warm start (2 heads, which learn to copy in fewer
    steps; 700 + 200 steps, enough to learn the copy on AVX-512 and AVX2 CPUs alike: with 450 + 60 whether it
    emerged depended on the CPU's float32 kernels), 40 GRPO steps. The warm start seldom calls the calculator; GRPO
    with the correctness reward must make it call far more often on held-out questions, and answer more of
    them right. A trainer that does not learn (no update, a wrong sign, a loss over the wrong tokens) leaves
    these where they were or lowers them."""
    common = ["--cache-dir", str(tmp_path / "cache"), "--warm-num-heads", "2", "--warm-clean-steps", "700"]
    common += ["--warm-habit-steps", "200"]
    result = example.main(
        [*common, "--n-eval", "64", "--eval-samples", "2", "max_steps=40", f"output_dir={tmp_path / 'run'}"]
    )

    before, after = result["before"]["held_out"], result["after"]["held_out"]
    assert before["tool_use"] < 0.3 and before["greedy_tool_use"] < 0.3  # the teacher's habit: seldom a call
    # measured (AVX-512 / AVX2 simulated with ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2 GRPOKIT_CPU_CAPS=avx2):
    # greedy tool use and accuracy 0.00 -> 1.00 on both; sampled tool use 0.05 -> 0.76 / 0.06 -> 0.55,
    # sampled accuracy 0.05 -> 0.70 / 0.05 -> 0.53
    assert after["greedy_tool_use"] > before["greedy_tool_use"] + 0.5
    assert after["greedy_accuracy"] > before["greedy_accuracy"] + 0.5
    assert after["tool_use"] > before["tool_use"] + 0.3
    assert after["accuracy"] > before["accuracy"] + 0.3
    assert json.loads((tmp_path / "run" / "tools.json").read_text())["after"] == result["after"]
    steps = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == list(range(1, 41))
    assert {"tool_use", "tools/call_frequency", "rewards/answer_correct/mean"} <= set(steps[-1])
    # the warm start is cached: a second run loads it instead of training again
    (cached,) = (tmp_path / "cache").glob("policy-*")
    stamp = (cached / "model.safetensors").stat().st_mtime_ns
    example.main([*common, "--n-eval", "64", "--eval-samples", "1", "max_steps=1", f"output_dir={tmp_path / 'run2'}"])
    assert (cached / "model.safetensors").stat().st_mtime_ns == stamp
