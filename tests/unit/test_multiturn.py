"""Multi-turn rollouts (grpokit/rollout/multiturn.py): the kept KV cache against re-prefilling every turn,
log-probs against one forward pass, the loss mask token by token, failing tools, and sequences leaving
the decoding batch."""

from __future__ import annotations

import threading
import time

import pytest
import torch
from shared_helpers import sampling_params

from grpokit.rollout.engine import HFRolloutEngine
from grpokit.rollout.logits_rules import logits_rules
from grpokit.rollout.multiturn import MultiTurnEngine, rollout_generators
from grpokit.rollout.next_token import sample_next
from grpokit.testing import build_tiny_causal_lm
from grpokit.testing.tools import qwen_style_tokenizer
from grpokit.tools import ConversationTokens, ToolCall, ToolExecutor, ToolLoop
from grpokit.train.learning.policy_logprobs import build_batch, completion_logprobs

CPU = torch.device("cpu")
END = "<|im_end|>"

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: see conftest.one_thread


def echo(text: str) -> str:
    """Echo a text back.

    Args:
        text: The text.
    """
    return f"echo {text}!"


def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: The first factor.
        b: The second factor.
    """
    return a * b


def boom(x: int) -> int:
    """Raise.

    Args:
        x: Anything.
    """
    raise RuntimeError(f"boom {x}")


def hang(x: int) -> int:
    """Sleep for a long time.

    Args:
        x: Anything.
    """
    time.sleep(60)
    return x


def echo_parser(text: str) -> list[ToolCall]:
    """A random model never writes a real tool call: here a turn calls ``echo`` unless its length is a
    multiple of 3, so random turns give rollouts of different numbers of rounds."""
    if len(text) % 3 == 0:
        return []
    return [ToolCall("echo", {"text": text[-3:]}, text, 0, len(text))]


@pytest.fixture(scope="module")
def chat():
    return ConversationTokens(qwen_style_tokenizer())


@pytest.fixture(scope="module", params=["qwen2", "gpt2"])
def model(request, chat):
    # qwen2: the fused decoder decodes (grouped-query attention, 2 heads on 1 KV head); gpt2: the HF forward does
    model, _ = build_tiny_causal_lm(
        None,
        chat.tokenizer,
        arch=request.param,
        hidden_size=32,
        num_layers=2,
        num_heads=2,
        num_kv_heads=1,
        max_positions=2048,
    )
    return model.eval()


# about one token in seven ends a turn, so random turns are short and rollouts have several
STOPS = list(range(0, 262, 7))
PROMPTS = [[{"role": "user", "content": "hi"}], [{"role": "user", "content": "what is 12 times 34?"}]]


def reprefill_reference(model, chat, executor, params, generators, max_iterations):
    """ToolLoop.run with a generate that runs each rollout alone: its whole conversation prefilled at every
    turn (no padding), then decoded token by token, from the rollout's own random stream; the logits
    processors of ``params`` see the conversation so far as the turn's prompt (TRL: one generate call per turn)."""
    loop = ToolLoop(
        chat,
        executor,
        max_completion_length=params.max_completion_length,
        max_tool_calling_iterations=max_iterations,
        parser=echo_parser,
    )
    rollouts = [loop.start(PROMPTS[n // 4]) for n in range(8)]
    index = {id(r.conversation.ids): n for n, r in enumerate(rollouts)}
    stops = {chat.end_of_turn, *STOPS}
    logprobs = {n: [] for n in range(8)}

    @torch.no_grad()
    def generate(token_ids, max_new_tokens):
        turns = []
        for ids, limit in zip(token_ids, max_new_tokens):
            n = index[id(ids)]
            out = model(torch.tensor([ids]), use_cache=True)
            turn = []
            rules = logits_rules(params, [ids], sorted(stops), out.logits.size(-1))
            while True:
                logits = out.logits[:, -1]
                processed = None if rules is None else rules.apply(logits, [0], len(turn))
                token, logprob = sample_next(logits, params, [generators[n]], processed)
                if rules is not None:
                    rules.append([0], token)
                turn.append(int(token))
                logprobs[n].append(float(logprob))
                if turn[-1] in stops or len(turn) == limit:
                    break
                out = model(token[:, None], past_key_values=out.past_key_values, use_cache=True)
            turns.append(turn)
        return turns

    loop.run(rollouts, generate)
    return rollouts, logprobs


# the logits processors (TRL's repetition_penalty, generation_kwargs) per turn, over the whole conversation
RULES = dict(repetition_penalty=1.5, min_new_tokens=3, begin_suppress_tokens=(5, 6), no_repeat_ngram_size=3)


@pytest.mark.parametrize("keep_cache", [True, False])
@pytest.mark.parametrize("greedy, rules", [(False, False), (True, False), (False, True), (True, True)])
def test_kept_cache_equals_reprefilling_every_turn(model, chat, keep_cache, greedy, rules):
    params = sampling_params(max_completion_length=240, temperature=0.8, greedy=greedy, **(RULES if rules else {}))
    with ToolExecutor([echo], isolation="thread") as executor:
        engine = HFRolloutEngine(model, STOPS, chat.tokenizer.pad_token_id, CPU, seed=5)
        multi = MultiTurnEngine(
            engine, chat, executor, max_tool_calling_iterations=3, parser=echo_parser, keep_cache=keep_cache
        )
        decoded_states = set()
        multi.on_step = lambda rows, rollouts: decoded_states.update(rollouts[i].state for i in rows)
        rollouts = multi.generate(PROMPTS, 4, params)
        reference, reference_logprobs = reprefill_reference(
            model, chat, executor, params, rollout_generators(torch.Generator().manual_seed(5), 8), 3
        )
    assert decoded_states == {"generating"}  # sequences waiting on tools or done never decode
    rounds = [c.tool_rounds for c in rollouts.conversations]
    if not greedy:
        assert len(set(rounds)) > 2 and max(rounds) == 3, f"the seed should give varied rollouts: {rounds}"
    for n, expected in enumerate(reference):
        prompt = rollouts.prompt_ids[n // 4]
        length = int(rollouts.completion_lengths[n])
        assert prompt + rollouts.completion_ids[n, :length].tolist() == expected.conversation.ids
        assert rollouts.loss_mask[n, :length].tolist() == expected.conversation.mask[len(prompt) :]
        assert (rollouts.completion_ids[n, length:] == chat.tokenizer.pad_token_id).all()
        sampled = rollouts.loss_mask[n].bool()
        torch.testing.assert_close(
            rollouts.logprobs[n][sampled], torch.tensor(reference_logprobs[n]), atol=1e-4, rtol=0
        )
        assert (rollouts.logprobs[n][~sampled] == 0).all()
        assert rollouts.conversations[n].stop_reason == expected.stop_reason
        assert rollouts.conversations[n].messages == expected.messages[1:]


def test_logits_rules_change_multi_turn_rollouts(model, chat):
    """The test above compares with and without the processors against a reference; here: they act at all."""
    with ToolExecutor([echo], isolation="thread") as executor:
        engine = HFRolloutEngine(model, STOPS, chat.tokenizer.pad_token_id, CPU, seed=5)
        multi = MultiTurnEngine(engine, chat, executor, max_tool_calling_iterations=3, parser=echo_parser)
        plain = multi.generate(PROMPTS, 1, sampling_params(max_completion_length=60, greedy=True))
        ruled = multi.generate(PROMPTS, 1, sampling_params(max_completion_length=60, greedy=True, **RULES))
    assert plain.completion_ids.tolist() != ruled.completion_ids.tolist()
    first = [int(ruled.completion_ids[n, 0]) for n in range(2)]
    assert not set(first) & {5, 6} and not set(first) & set(STOPS)  # begin_suppress_tokens; min_new_tokens


def test_logprobs_equal_one_forward_over_the_conversation(model, chat):
    params = sampling_params(max_completion_length=240)
    with ToolExecutor([echo], isolation="thread") as executor:
        engine = HFRolloutEngine(model, STOPS, chat.tokenizer.pad_token_id, CPU, seed=2)
        rollouts = MultiTurnEngine(engine, chat, executor, parser=echo_parser).generate(PROMPTS, 4, params)
    assert (rollouts.loss_mask < rollouts.completion_mask).any(), "some rollout should have tool tokens"
    batch = build_batch(model, rollouts, chat.tokenizer.pad_token_id, CPU)
    with torch.no_grad():
        logprobs, _ = completion_logprobs(model, batch, temperature=1.0)
    sampled = rollouts.loss_mask.bool()
    torch.testing.assert_close(logprobs[sampled], rollouts.logprobs[sampled], atol=1e-4, rtol=0)


class ScriptedLM(torch.nn.Module):
    """A custom module (``forward(input_ids) -> logits``) that writes scripted turns: the user message names
    the script (``Q<k>``), the count of assistant headers in the sequence is the turn, and the tokens
    after the last header say how far into the turn it is."""

    def __init__(self, tokenizer, scripts: dict[str, list[str]]):
        super().__init__()
        self.tokenizer = tokenizer
        self.scripts = {
            k: [tokenizer.encode(t, add_special_tokens=False) for t in turns] for k, turns in scripts.items()
        }
        self.header = tokenizer.encode("<|im_start|>assistant\n", add_special_tokens=False)
        self.unused = torch.nn.Parameter(torch.zeros(1))

    def forward(self, input_ids):
        logits = torch.zeros((*input_ids.shape, len(self.tokenizer)))
        pad = self.tokenizer.pad_token_id
        for row, ids in enumerate(input_ids.tolist()):
            while ids[-1] == pad:
                ids.pop()
            text = self.tokenizer.decode(ids)
            key = next(k for k in self.scripts if f"Q{k}" in text)
            h = len(self.header)
            starts = [i + h for i in range(len(ids) - h + 1) if ids[i : i + h] == self.header]
            script = self.scripts[key][len(starts) - 1]
            logits[row, len(ids) - 1, script[len(ids) - starts[-1]]] = 30.0
        return logits


def scripted_engine(chat, scripts, executor, **kwargs):
    model = ScriptedLM(chat.tokenizer, scripts)
    engine = HFRolloutEngine(model, [chat.tokenizer.eos_token_id], chat.tokenizer.pad_token_id, CPU)
    return MultiTurnEngine(engine, chat, executor, **kwargs)


def tool_call(name: str, arguments: str) -> str:
    return f'<tool_call>\n{{"name": "{name}", "arguments": {arguments}}}\n</tool_call>{END}'


def test_loss_mask_token_by_token_on_a_hand_built_conversation(chat):
    tok = chat.tokenizer
    first, second = tool_call("multiply", '{"a": 12, "b": 34}'), f"It is 408.{END}"
    with ToolExecutor([multiply], isolation="thread") as executor:
        multi = scripted_engine(chat, {"0": [first, second], "1": [f"Hi.{END}"]}, executor)
        rollouts = multi.generate(
            [[{"role": "user", "content": "Q0"}], [{"role": "user", "content": "Q1"}]],
            2,
            sampling_params(max_completion_length=300),
        )
    # what the environment adds after a turn with calls, as the template writes it (Qwen2.5's format)
    suffix = f"\n<|im_start|>user\n<tool_response>\n408\n</tool_response>{END}\n<|im_start|>assistant\n"
    pieces = [(first, 1), (suffix, 0), (second, 1)]
    ids = [t for text, _ in pieces for t in tok.encode(text, add_special_tokens=False)]
    mask = [m for text, m in pieces for _ in tok.encode(text, add_special_tokens=False)]
    for n in (0, 1):  # both rollouts of the first prompt
        assert rollouts.completion_ids[n, : len(ids)].tolist() == ids
        assert rollouts.loss_mask[n].tolist() == mask
        assert rollouts.completion_mask[n].tolist() == [1] * len(ids)
        assert rollouts.logprobs[n][rollouts.loss_mask[n] == 0].eq(0).all()
        assert rollouts.logprobs[n][rollouts.loss_mask[n] == 1].gt(-1e-6).all()  # the scripted tokens: p = 1
    assert tok.decode(rollouts.prompt_ids[0]).endswith("Q0<|im_end|>\n<|im_start|>assistant\n")
    answer = tok.encode(f"Hi.{END}", add_special_tokens=False)
    assert rollouts.completion_ids[2, : len(answer)].tolist() == answer and rollouts.loss_mask[2].sum() == len(answer)
    assert rollouts.finish_reasons == ["stop"] * 4

    conversation = rollouts.conversations[0]
    assert conversation.stop_reason == "answered" and conversation.tool_rounds == 1
    assistant, tool, answer_turn = conversation.turns
    assert (assistant.role, tool.role, answer_turn.role) == ("assistant", "tool", "assistant")
    assert assistant.text == first[: -len(END)] and answer_turn.text == "It is 408."
    assert assistant.tool_calls == [{"name": "multiply", "arguments": {"a": 12, "b": 34}}]
    assert (tool.name, tool.arguments, tool.text, tool.status, tool.error) == (
        "multiply",
        {"a": 12, "b": 34},
        "408",
        "ok",
        None,
    )
    assert tool.started <= tool.ended and assistant.started <= assistant.ended <= answer_turn.started
    for turn, text in zip(conversation.turns, (first, suffix, second)):
        start, end = turn.tokens
        assert tok.decode(rollouts.completion_ids[0, start:end].tolist()) == text
    assert [m["role"] for m in conversation.messages] == ["assistant", "tool", "assistant"]


def test_failing_tools_do_not_stop_the_batch(chat):
    scripts = {
        "0": [tool_call("multiply", '{"a": 2, "b": 3}'), f"6{END}"],
        "1": [tool_call("boom", '{"x": 1}'), f"oops{END}"],
        "2": [tool_call("hang", '{"x": 1}'), f"late{END}"],
        "3": [tool_call("nope", "{}"), f"huh{END}"],
    }
    prompts = [[{"role": "user", "content": f"Q{k}"}] for k in scripts]
    # multiply and boom must answer within the timeout on a loaded machine too: 3 s (hang sleeps 60)
    with ToolExecutor([multiply, boom, hang], timeout=3.0, max_workers=3) as executor:
        rollouts = scripted_engine(chat, scripts, executor).generate(
            prompts, 2, sampling_params(max_completion_length=300)
        )
    tools = [c.turns[1] for c in rollouts.conversations[::2]]
    assert [t.status for t in tools] == ["ok", "error", "timeout", "invalid"]
    assert "boom 1" in tools[1].error and "timed out" in tools[2].error and "nope" in tools[3].error
    assert [c.stop_reason for c in rollouts.conversations] == ["answered"] * 8
    assert [c.turns[-1].text for c in rollouts.conversations[::2]] == ["6", "oops", "late", "huh"]


def test_sequences_waiting_or_done_leave_the_decoding_batch(chat):
    """Rollout 0 waits on a tool that returns only once rollout 1 decoded 5 steps alone; rollout 1 is done
    before rollout 0 answers. Counted from the decoding steps, not from time: the step that releases the tool also
    waits for its result to be ready, so the next step finds it however slowly the tool's thread is scheduled."""
    go = threading.Event()
    submitted: list = []  # the tool calls' futures, in order

    def wait_for_go(x: int) -> str:
        """Wait.

        Args:
            x: Anything.
        """
        # a deadlock guard only (the decoding loop sets go after 5 steps): 600 s, far past any loaded machine
        return "go" if go.wait(600) else "never"

    scripts = {"0": [tool_call("wait_for_go", '{"x": 0}'), f"Done, and a long answer.{END}"], "1": ["b" * 100 + END]}
    steps: list[list[int]] = []

    def on_step(rows, rollouts):
        assert all(rollouts[i].state == "generating" for i in rows)
        steps.append(rows)
        if sum(s == [1] for s in steps) == 5:
            go.set()
            submitted[0].result(timeout=600)  # the tool's result is ready before the next step polls for it

    with ToolExecutor([wait_for_go], isolation="thread", max_workers=2) as executor:
        submit = executor.submit

        def recording_submit(*args, **kwargs):
            submitted.append(submit(*args, **kwargs))
            return submitted[-1]

        executor.submit = recording_submit
        multi = scripted_engine(chat, scripts, executor)
        multi.on_step = on_step
        rollouts = multi.generate(
            [[{"role": "user", "content": "Q0"}], [{"role": "user", "content": "Q1"}]],
            1,
            sampling_params(max_completion_length=300),
        )
    assert rollouts.conversations[0].turns[1].text == "go"
    first_turn, second_turn = (len(chat.tokenizer.encode(t, add_special_tokens=False)) for t in scripts["0"])
    assert steps[:first_turn] == [[0, 1]] * first_turn
    assert steps[first_turn : first_turn + 5] == [[1]] * 5  # rollout 0 waited on its tool outside the batch
    assert [1, 0] in steps  # then it rejoined
    # each rollout was decoded once per token it sampled, no more: done rows left the batch
    assert sum(0 in s for s in steps) == first_turn + second_turn and sum(1 in s for s in steps) == 101
    assert steps[-1] == [1]


def test_per_row_generators_make_each_draw_independent_of_the_batch():
    logits = torch.randn(3, 300, generator=torch.Generator().manual_seed(0))
    params = sampling_params(max_completion_length=1)
    together, together_logprobs = sample_next(logits, params, rollout_generators(torch.Generator().manual_seed(4), 3))
    for row, generator in enumerate(rollout_generators(torch.Generator().manual_seed(4), 3)):
        alone, alone_logprob = sample_next(logits[row : row + 1], params, [generator])
        assert int(alone) == int(together[row])
        torch.testing.assert_close(alone_logprob, together_logprobs[row : row + 1])
    with pytest.raises(ValueError, match="2 generators for 3 rows"):
        sample_next(logits, params, rollout_generators(torch.Generator(), 2))


def test_rows_of_different_lengths_are_right_aligned_in_one_block():
    from grpokit.kernels.kv_cache import PreallocatedLayer
    from grpokit.rollout.multiturn_rows import build_block

    # two rows, one layer, 1 head of dim 1: row 0 holds keys 1, 2; row 1 holds 3, 4, 5, 6 (values = -keys)
    rows = [torch.tensor([[[1.0], [2.0]]]), torch.tensor([[[3.0], [4.0], [5.0], [6.0]]])]
    block = build_block([[(k, -k)] for k in rows], room=2)
    layer = block.cache.layers[0]
    assert isinstance(layer, PreallocatedLayer) and block.length == 4
    assert layer.keys[:, 0, :, 0].tolist() == [[0, 0, 1, 2], [3, 4, 5, 6]]  # zeros before row 0's start
    assert block.mask.tolist() == [[False, False, True, True, False, False], [True] * 4 + [False] * 2]
    assert block.position.tolist() == [2, 4]
    # a token appended to both rows goes to column 4; rebuilding with row 1 first, then a new row of 5
    layer.update(torch.tensor([[[[7.0]]], [[[8.0]]]]), torch.zeros(2, 1, 1, 1))
    block.mask[:, 4], block.length, block.position = True, 5, block.position + 1
    merged = build_block([[(torch.arange(5.0).view(1, 5, 1), torch.zeros(1, 5, 1))]], room=1, base=block, base_rows=[1])
    assert merged.cache.layers[0].keys[:, 0, :, 0].tolist() == [[3, 4, 5, 6, 8], [0, 1, 2, 3, 4]]
    assert merged.mask.tolist() == [[True] * 5 + [False]] * 2 and merged.position.tolist() == [5, 5]
    assert block.row(0)[0][0][0, :, 0].tolist() == [1, 2, 7]  # a row's own filled columns


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


def test_environment_sessions_and_prompts_that_differ_within_a_group(chat):
    from grpokit.tools import Environments

    tok = chat.tokenizer
    scripts = {"0": [tool_call("increment", '{"by": 2}'), f"Done.{END}"]}
    rows = [{"prompt": [{"role": "user", "content": "Q0"}], "start": start} for start in (3, 0)]
    sessions = Environments(Counter).sessions(rows)
    with ToolExecutor([], isolation="thread") as executor:
        rollouts = scripted_engine(chat, scripts, executor).generate(
            [rows[0]["prompt"]], 2, sampling_params(max_completion_length=300), sessions=sessions
        )
    assert [s.instance.value for s in sessions] == [5, 2]
    assert [c.turns[1].text for c in rollouts.conversations] == ["5", "2"]
    # the observations differ from their digit on: the group's prompt_ids stop there, the rest opens the completion
    assert tok.decode(rollouts.prompt_ids[0]).endswith("Q0 (the counter is at ")
    for n, start in enumerate((3, 0)):
        rest = tok.encode(f"{start})<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)
        turn = tok.encode(scripts["0"][0], add_special_tokens=False)
        assert rollouts.completion_ids[n, : len(rest) + len(turn)].tolist() == rest + turn
        assert rollouts.loss_mask[n, : len(rest) + len(turn)].tolist() == [0] * len(rest) + [1] * len(turn)
        assert rollouts.conversations[n].turns[0].tokens == (len(rest), len(rest) + len(turn))
    with ToolExecutor([], isolation="thread") as executor, pytest.raises(ValueError, match="1 environment sessions"):
        scripted_engine(chat, scripts, executor).generate(
            [rows[0]["prompt"]], 2, sampling_params(max_completion_length=300), sessions=sessions[:1]
        )


def test_bf16_autocast_and_models_without_a_plain_cache(chat):
    """Under bf16 autocast the kept cache is bf16 (log-probs within bf16 precision of a float32 forward); a model
    with sliding-window cache layers decodes by full forward passes (log-probs equal to a forward)."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    torch.manual_seed(0)
    sliding = AutoModelForCausalLM.from_config(
        Qwen2Config(
            vocab_size=len(chat.tokenizer),
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=1,
            intermediate_size=64,
            max_position_embeddings=2048,
            use_sliding_window=True,
            sliding_window=64,
            max_window_layers=0,
            pad_token_id=chat.tokenizer.pad_token_id,
        )
    ).eval()
    tiny, _ = build_tiny_causal_lm(
        None, chat.tokenizer, arch="qwen2", hidden_size=32, num_layers=2, num_heads=2, max_positions=2048
    )
    for model, dtype, atol in ((tiny.eval(), torch.bfloat16, 5e-2), (sliding, None, 1e-4)):
        with ToolExecutor([echo], isolation="thread") as executor:
            engine = HFRolloutEngine(model, STOPS, chat.tokenizer.pad_token_id, CPU, seed=2, autocast_dtype=dtype)
            rollouts = MultiTurnEngine(engine, chat, executor, parser=echo_parser).generate(
                PROMPTS, 2, sampling_params(max_completion_length=160)
            )
        assert max(c.tool_rounds for c in rollouts.conversations) >= 1
        with torch.no_grad():
            logprobs, _ = completion_logprobs(model, build_batch(model, rollouts, 0, CPU), temperature=1.0)
        sampled = rollouts.loss_mask.bool()
        torch.testing.assert_close(logprobs[sampled], rollouts.logprobs[sampled], atol=atol, rtol=0)


def test_the_token_budget(chat):
    tok = chat.tokenizer
    call = tool_call("multiply", '{"a": 2, "b": 3}')
    scripts = {"0": ["a" * 200 + END], "1": [call, f"6{END}"]}
    prompts = [[{"role": "user", "content": f"Q{k}"}] for k in scripts]
    budget = len(tok.encode(call, add_special_tokens=False)) + 10  # the call fits, its result does not
    with ToolExecutor([multiply], isolation="thread") as executor:
        rollouts = scripted_engine(chat, scripts, executor).generate(prompts, 1, sampling_params(budget))
    assert rollouts.finish_reasons == ["length", "length"]
    assert rollouts.completion_lengths.tolist() == [budget, budget - 10]
    assert rollouts.completion_ids[0, :budget].tolist() == tok.encode("a" * budget, add_special_tokens=False)
    cut, unshown = rollouts.conversations
    assert [t.role for t in cut.turns] == ["assistant"] and cut.stop_reason == "length"
    # the call ran, its result was not shown: recorded without tokens, not among the messages
    assert [(t.role, t.tokens) for t in unshown.turns] == [("assistant", (0, budget - 10)), ("tool", None)]
    assert unshown.turns[1].text == "6" and [m["role"] for m in unshown.messages] == ["assistant"]
