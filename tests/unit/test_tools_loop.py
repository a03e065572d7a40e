"""The multi-turn tool loop on scripted turns: answers, tool rounds, malformed calls, the iteration
limit, the token budget, environments, and sequences leaving the decoding batch while tools run."""

from __future__ import annotations

import time

import pytest

from grpokit.testing.tools import qwen_style_tokenizer
from grpokit.tools.conversation import ConversationTokens, render_ids
from grpokit.tools.environment import EnvironmentPool
from grpokit.tools.executor import ToolExecutor
from grpokit.tools.loop import ToolLoop

END = "<|im_end|>"


def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: The first factor.
        b: The second factor.
    """
    return a * b


def slow(seconds: float) -> str:
    """Sleep.

    Args:
        seconds: How long.
    """
    time.sleep(seconds)
    return "slept"


def long_text(n: int) -> str:
    """A long result.

    Args:
        n: Its length.
    """
    return "x" * n


def call(name: str, arguments: str) -> str:
    return f'<tool_call>\n{{"name": "{name}", "arguments": {arguments}}}\n</tool_call>{END}'


@pytest.fixture(scope="module")
def chat():
    return ConversationTokens(qwen_style_tokenizer())


@pytest.fixture(scope="module")
def executor():
    with ToolExecutor([multiply, slow, long_text], timeout=10.0, max_workers=2) as ex:
        yield ex


class Scripted:
    """A 'model' that writes each rollout's scripted turns in order (cut to max_new_tokens), and
    records which rollouts each generate call decoded."""

    def __init__(self, tokenizer, scripts):
        self.tokenizer = tokenizer
        self.scripts = scripts  # {rollout index: [turn text, ...]}
        self.rollouts = None
        self.batches: list[list[int]] = []

    def __call__(self, token_ids, max_new_tokens):
        index = {id(r.conversation.ids): i for i, r in enumerate(self.rollouts)}
        batch = [index[id(ids)] for ids in token_ids]
        self.batches.append(batch)
        out = []
        for i, limit in zip(batch, max_new_tokens):
            text = self.scripts[i][len(self.rollouts[i].conversation.spans)]
            out.append(self.tokenizer.encode(text, add_special_tokens=False)[:limit])
        return out


def run(loop, prompts, scripts, sessions=None):
    rollouts = [loop.start(p, None if sessions is None else sessions[i]) for i, p in enumerate(prompts)]
    model = Scripted(loop.chat.tokenizer, scripts)
    model.rollouts = rollouts
    loop.run(rollouts, model)
    return rollouts, model


def user(text):
    return [{"role": "user", "content": text}]


def test_rounds_answers_malformed_calls_and_the_iteration_limit(chat, executor):
    loop = ToolLoop(chat, executor, max_completion_length=400, max_tool_calling_iterations=2)
    scripts = {
        0: [call("multiply", '{"a": 12, "b": 34}'), "It is 408." + END],
        1: ["It is 6." + END],
        2: ["<tool_call>\n{bad json\n</tool_call>" + END, call("multiply", '{"a": 2, "b": 3}'), "6" + END],
        3: [call("multiply", '{"a": 1, "b": 1}')] * 3,
    }
    rollouts, _ = run(loop, [user(q) for q in ("12*34?", "2*3?", "2*3 again?", "1*1?")], scripts)
    assert [r.stop_reason for r in rollouts] == ["answered", "answered", "answered", "max_iterations"]
    assert [r.iterations for r in rollouts] == [1, 0, 2, 2]
    assert [[x.status for x in r.results] for r in rollouts] == [["ok"], [], ["invalid", "ok"], ["ok", "ok"]]
    assert "not valid JSON" in rollouts[2].results[0].content

    tok = chat.tokenizer
    first = rollouts[0]
    assert [m["role"] for m in first.messages] == ["user", "assistant", "tool", "assistant"]
    assert first.messages[1]["tool_calls"][0]["function"] == {"name": "multiply", "arguments": {"a": 12, "b": 34}}
    assert first.messages[2]["content"] == "408" and first.messages[3]["content"] == "It is 408."
    # the tokens are the conversation as the template renders it, the mask exactly the scripted turns
    conversation = first.conversation
    full = render_ids(tok, first.messages, tools=loop.executor.schemas)
    assert conversation.ids == full[: len(conversation.ids)]
    for r, script in zip(rollouts, scripts.values()):
        spans = r.conversation.spans
        assert [tok.decode(r.conversation.ids[a:b]) for a, b in spans] == script[: len(spans)]
        assert sum(r.conversation.mask) == sum(b - a for a, b in spans)


def test_the_token_budget(chat, executor):
    loop = ToolLoop(chat, executor, max_completion_length=120)
    scripts = {
        0: [call("long_text", '{"n": 500}'), "never" + END],  # its result does not fit: not shown
        1: ["a" * 200 + END],  # cut at the budget
        2: [call("long_text", '{"n": 5}'), "b" * 200],  # fits, then the answer is cut
    }
    rollouts, _ = run(loop, [user("long"), user("ramble"), user("short")], scripts)
    assert [r.stop_reason for r in rollouts] == ["length", "length", "length"]
    assert [len(r.results) for r in rollouts] == [1, 0, 1]
    assert [m["role"] for m in rollouts[0].messages] == ["user", "assistant"]  # the result was never shown
    for r in rollouts:
        assert len(r.conversation.completion_ids) <= 120
    assert len(rollouts[1].conversation.completion_ids) == 120
    assert len(rollouts[2].conversation.completion_ids) == 120


def test_waiting_sequences_leave_the_decoding_batch(chat, executor):
    loop = ToolLoop(chat, executor, max_completion_length=400)
    scripts = {
        0: [call("slow", '{"seconds": 1.5}'), "done" + END],
        1: [call("multiply", '{"a": 1, "b": 2}'), call("multiply", '{"a": 2, "b": 2}'), "4" + END],
    }
    rollouts, model = run(loop, [user("wait"), user("quick")], scripts)
    assert [r.stop_reason for r in rollouts] == ["answered", "answered"]
    # rollout 1 decoded its next turns while rollout 0 waited on its tool
    assert model.batches == [[0, 1], [1], [1], [0]]


class Counter:
    def reset(self, start: int, **row) -> str:
        self.value = start
        return f" (the counter is at {start})"

    def increment(self, by: int) -> str:
        """Add to the counter.

        Args:
            by: How much.
        """
        self.value += by
        return str(self.value)

    def get_reward(self) -> float:
        return float(self.value == 5)


def test_environment_rollouts(chat, executor):
    loop = ToolLoop(chat, executor, max_completion_length=400)
    rows = [{"prompt": user("Count to 5."), "start": 3}, {"prompt": user("Count to 5."), "start": 0}]
    sessions = EnvironmentPool(Counter).sessions(rows)
    scripts = {0: [call("increment", '{"by": 2}'), "Done." + END], 1: [call("increment", '{"by": 1}'), "Done." + END]}
    rollouts, _ = run(loop, [row["prompt"] for row in rows], scripts, sessions)
    assert rollouts[0].messages[0]["content"] == "Count to 5. (the counter is at 3)"
    assert [r.results[0].content for r in rollouts] == ["5", "1"]
    assert [s.get_reward() for s in sessions] == [1.0, 0.0]
    # the environment's tool was in the prompt
    assert '"name": "increment"' in chat.tokenizer.decode(
        rollouts[0].conversation.ids[: rollouts[0].conversation.prompt_length]
    )


def square(x: int) -> int:
    """Square.

    Args:
        x: A number.
    """
    return x * x


@pytest.mark.usefixtures("one_thread")
def test_logprobs_of_a_multi_turn_rollout_equal_one_forward(chat):
    """A tiny model writes a forced tool call, then samples; the log-probs it had while generating (each
    turn prefilled from the conversation so far) equal those of one forward over the finished sequence,
    at the mask."""
    import torch

    from grpokit.testing import build_tiny_causal_lm

    tok = chat.tokenizer
    model, _ = build_tiny_causal_lm(
        None, tok, arch="qwen2", hidden_size=32, num_layers=2, num_heads=2, max_positions=2048
    )
    model.eval()
    forced = tok.encode(call("square", '{"x": 3}'), add_special_tokens=False)
    sampled_turn_length = 6
    generator = torch.Generator().manual_seed(0)
    seen: list[float] = []  # log-prob of each generated token, when it was generated

    @torch.no_grad()
    def generate(token_ids, max_new_tokens):
        turns = []
        for ids, limit in zip(token_ids, max_new_tokens):
            first_turn = len(seen) == 0
            out = model(torch.tensor([ids]), use_cache=True)  # the whole conversation so far, then token by token
            turn = []
            for step in range(min(limit, len(forced) if first_turn else sampled_turn_length)):
                logprobs = torch.log_softmax(out.logits[0, -1].double(), -1)
                token = forced[step] if first_turn else int(torch.multinomial(logprobs.exp(), 1, generator=generator))
                seen.append(float(logprobs[token]))
                turn.append(token)
                out = model(torch.tensor([[token]]), past_key_values=out.past_key_values, use_cache=True)
            turns.append(turn)
        return turns

    with ToolExecutor([square], timeout=10.0, max_workers=1) as executor:
        loop = ToolLoop(chat, executor, max_completion_length=400)
        rollout = loop.start(user("3*3?"))
        loop.run([rollout], generate)
    assert rollout.results[0].content == "9" and rollout.iterations == 1
    assert rollout.stop_reason == "length"  # the sampled turn is cut without an end-of-turn token
    conversation = rollout.conversation
    assert sum(conversation.mask) == len(forced) + sampled_turn_length == len(seen)

    with torch.no_grad():
        logits = model(torch.tensor([conversation.ids])).logits[0].double()  # [L, V]
    logprobs = torch.log_softmax(logits[:-1], -1).gather(1, torch.tensor(conversation.ids[1:])[:, None])[:, 0]  # [L-1]
    generated = torch.tensor(conversation.mask[1:], dtype=torch.bool)  # token t+1 is predicted at position t
    torch.testing.assert_close(logprobs[generated], torch.tensor(seen, dtype=torch.float64), atol=1e-4, rtol=0)
