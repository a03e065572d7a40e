"""TRL's round loop of tool rollouts with model.generate (grpokit/rollout/transformers_multiturn.py): one generate call
per round over the rows still going, the tool suffix between turns out of the loss mask, the policy's log-probs at
the sampled tokens, and the stop rules of grpokit.tools.ToolLoop."""

from __future__ import annotations

import pytest
import torch
from shared_helpers import sampling_params

from grpokit.rollout.transformers_engine import TransformersRolloutEngine
from grpokit.rollout.transformers_multiturn import TransformersMultiTurnEngine
from grpokit.testing import build_tiny_causal_lm
from grpokit.testing.tools import qwen_style_tokenizer
from grpokit.tools import ConversationTokens, ToolCall, ToolExecutor

pytestmark = pytest.mark.usefixtures("one_thread")
CPU = torch.device("cpu")
END = "<|im_end|>"
PROMPTS = [[{"role": "user", "content": "Q0"}], [{"role": "user", "content": "Q1"}]]


def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: The first factor.
        b: The second factor.
    """
    return a * b


def tool_call(a: int, b: int) -> str:
    return f'<tool_call>\n{{"name": "multiply", "arguments": {{"a": {a}, "b": {b}}}}}\n</tool_call>{END}'


def suffix(result: int) -> str:
    """What the template adds after a turn with a call (Qwen2.5's format): the result, then the assistant header."""
    return f"\n<|im_start|>user\n<tool_response>\n{result}\n</tool_response>{END}\n<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def chat():
    return ConversationTokens(qwen_style_tokenizer())


@pytest.fixture(scope="module")
def model(chat):
    model, _ = build_tiny_causal_lm(
        None, chat.tokenizer, arch="qwen2", hidden_size=32, num_layers=1, num_heads=2, max_positions=2048
    )
    return model.float().eval()


def engine_for(model, chat, executor, eos=(), **kwargs):
    tok = chat.tokenizer
    base = TransformersRolloutEngine(model, [tok.eos_token_id, *eos], tok.pad_token_id, CPU, seed=0)
    return TransformersMultiTurnEngine(base, chat, executor, **kwargs)


def scripted_generate(tok, scripts: list[list[str]], calls: list[dict]):
    """A fake ``generate`` as TRL's tests write one: call k returns ``scripts[k][row]`` after each row's input,
    right-padded with the pad token (as transformers pads rows that stopped early); ``calls`` gets each call's
    keyword arguments."""

    def generate(input_ids, **kwargs):
        calls.append({"input_ids": input_ids, **kwargs})
        turns = [tok.encode(text, add_special_tokens=False) for text in scripts[len(calls) - 1]]
        assert len(turns) == input_ids.size(0), "the round's row count is what the script expects"
        width = max(len(t) for t in turns) + 2  # two pad tokens after the longest: cut at the end of turn
        new = torch.tensor([t + [tok.pad_token_id] * (width - len(t)) for t in turns])
        return torch.cat([input_ids, new], dim=-1)

    return generate


def policy_logprobs(model, prompt: list[int], completion: list[int], temperature: float = 1.0) -> torch.Tensor:
    """[T] log softmax(logits / temperature) of one plain forward pass of the model over prompt + completion, at each
    completion token."""
    seq = torch.tensor([prompt + completion])
    with torch.no_grad():
        logp = torch.log_softmax(model(seq).logits[0, len(prompt) - 1 : -1].float() / temperature, -1)
    return logp.gather(-1, seq[0, len(prompt) :, None]).squeeze(-1)


def test_one_generate_call_per_round_over_the_rows_that_called_tools(chat, model):
    tok = chat.tokenizer
    answer = f"It is 6.{END}"
    scripts = [
        [tool_call(2, 3), answer, tool_call(4, 5), answer],  # round 1: all 4 rows (2 prompts x G = 2)
        [tool_call(6, 7), answer],  # round 2: rows 0 and 2, the ones that called a tool
        [answer],  # round 3: row 0 only
    ]
    calls: list[dict] = []
    with ToolExecutor([multiply], isolation="thread") as executor:
        multi = engine_for(model, chat, executor)
        model.generate = scripted_generate(tok, scripts, calls)
        try:
            rollouts = multi.generate(PROMPTS, 2, sampling_params(400))
        finally:
            del model.generate
    assert [c["input_ids"].size(0) for c in calls] == [4, 2, 1]
    for call in calls:  # TRL's arguments: left-padded ids, their mask, a GenerationConfig that stops at end of turn
        assert set(call) == {"input_ids", "attention_mask", "generation_config"}
        assert call["attention_mask"].shape == call["input_ids"].shape and call["attention_mask"][:, -1].all()
        assert chat.end_of_turn in call["generation_config"].eos_token_id
    # round 2's rows are their whole conversations so far: prompt, the call, the tool suffix
    row0 = [t for t, m in zip(calls[1]["input_ids"][0].tolist(), calls[1]["attention_mask"][0].tolist()) if m]
    assert tok.decode(row0).endswith(tool_call(2, 3) + suffix(6))

    pieces = [(tool_call(2, 3), 1), (suffix(6), 0), (tool_call(6, 7), 1), (suffix(42), 0), (answer, 1)]
    ids = [t for text, _ in pieces for t in tok.encode(text, add_special_tokens=False)]
    mask = [m for text, m in pieces for _ in tok.encode(text, add_special_tokens=False)]
    assert rollouts.completion_ids[0, : len(ids)].tolist() == ids and rollouts.loss_mask[0].tolist() == mask
    assert rollouts.completion_mask[0].sum() == len(ids)
    two = [(tool_call(4, 5), 1), (suffix(20), 0), (answer, 1)]
    two_ids = [t for text, _ in two for t in tok.encode(text, add_special_tokens=False)]
    assert rollouts.completion_ids[2, : len(two_ids)].tolist() == two_ids
    answer_ids = tok.encode(answer, add_special_tokens=False)
    assert rollouts.loss_mask[1].sum() == len(answer_ids) == rollouts.completion_mask[3].sum()
    assert [c.tool_rounds for c in rollouts.conversations] == [2, 0, 1, 0]
    assert [c.stop_reason for c in rollouts.conversations] == ["answered"] * 4
    assert rollouts.finish_reasons == ["stop"] * 4
    tools = [t for t in rollouts.conversations[0].turns if t.role == "tool"]
    assert [(t.name, t.text, t.status) for t in tools] == [("multiply", "6", "ok"), ("multiply", "42", "ok")]

    # log-probs: the policy's at the sampled tokens (one forward over the whole conversation), 0 on the tool's
    for n in range(4):
        length = int(rollouts.completion_mask[n].sum())
        want = policy_logprobs(model, list(rollouts.prompt_ids[n // 2]), rollouts.completion_ids[n, :length].tolist())
        sampled = rollouts.loss_mask[n, :length].bool()
        torch.testing.assert_close(rollouts.logprobs[n, :length][sampled], want[sampled], rtol=1e-4, atol=1e-5)
        assert rollouts.logprobs[n, :length][~sampled].eq(0).all()


def test_max_tool_calling_iterations_ends_the_loop(chat, model):
    tok = chat.tokenizer
    scripts = [[tool_call(2, 3)] * 2, [tool_call(6, 7)] * 2]  # the second round's calls are not run
    calls: list[dict] = []
    with ToolExecutor([multiply], isolation="thread") as executor:
        multi = engine_for(model, chat, executor, max_tool_calling_iterations=1)
        model.generate = scripted_generate(tok, scripts, calls)
        try:
            rollouts = multi.generate(PROMPTS[:1], 2, sampling_params(400))
        finally:
            del model.generate
    assert [c["input_ids"].size(0) for c in calls] == [2, 2]
    assert [c.stop_reason for c in rollouts.conversations] == ["max_iterations"] * 2
    assert [len([t for t in c.turns if t.role == "tool"]) for c in rollouts.conversations] == [1, 1]


def test_a_turn_past_the_budget_is_cut_and_ends_the_rollout(chat, model):
    """max_completion_length bounds the completion: generate is asked for the largest remaining budget, each row is
    cut to its own (TRL truncates the post-tool turn), and the rollout ends for length."""
    tok = chat.tokenizer
    long = "x" * 50 + END
    calls: list[dict] = []
    with ToolExecutor([multiply], isolation="thread") as executor:
        multi = engine_for(model, chat, executor)
        model.generate = scripted_generate(tok, [[long, long]], calls)
        try:
            rollouts = multi.generate(PROMPTS[:1], 2, sampling_params(20))
        finally:
            del model.generate
    assert calls[0]["generation_config"].max_new_tokens == 20
    assert rollouts.completion_mask.sum(1).tolist() == [20, 20] and rollouts.finish_reasons == ["length"] * 2
    assert [c.stop_reason for c in rollouts.conversations] == ["length"] * 2


def every_turn_calls(text: str) -> list[ToolCall]:
    """A random model never writes a real call: every turn calls ``multiply``."""
    return [ToolCall("multiply", {"a": 2, "b": 3}, text, 0, len(text))]


def test_real_generate_samples_rounds_with_the_policys_logprobs(chat, model):
    """Transformers' own generate on a random tiny model: every turn calls a tool (a stand-in parser), so with two
    rounds allowed there are three generate calls of all 4 rows; the same seed gives the same rollouts. One token
    in seven ends a turn (as EOS ids), so random turns are short."""
    counts: list[int] = []
    with ToolExecutor([multiply], isolation="thread") as executor:

        def sample():
            multi = engine_for(
                model, chat, executor, eos=range(0, 256, 7), max_tool_calling_iterations=2, parser=every_turn_calls
            )
            multi.on_generate = lambda rows: counts.append(len(rows))
            return multi.generate(PROMPTS, 2, sampling_params(200, temperature=1.3), seeds=[5, 6])

        first, second = sample(), sample()
    assert counts == [4, 4, 4] * 2
    assert torch.equal(first.completion_ids, second.completion_ids)
    for n in range(4):
        length = int(first.completion_mask[n].sum())
        completion = first.completion_ids[n, :length].tolist()
        want = policy_logprobs(model, list(first.prompt_ids[n // 2]), completion, temperature=1.3)
        sampled = first.loss_mask[n, :length].bool()
        assert int((~sampled).sum()) > 0  # tool suffixes are in the completion, out of the loss
        torch.testing.assert_close(first.logprobs[n, :length][sampled], want[sampled], rtol=1e-4, atol=1e-4)
