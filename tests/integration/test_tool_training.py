"""Training with tools end to end: multi-turn rollouts through GRPOTrainer (TRL's tools= / environment_factory=)
and the CLI config's agent section; the loss over the model's own tokens only; rewards given the conversations
and the environments; the store, `grpokit inspect` and the report showing turns; exact resume.

Two tiny models make tool rounds really happen: a scripted custom module (grpokit.testing.tools.scripted_chat_lm)
that writes a well-formed Qwen-style call, then an answer with two free digits (so the rollouts of a group
differ), and a random tiny Llama (the KV-cache engine and the fused decoder) whose turns a stand-in parser
(tools_for_tests.every_other_turn) reads as calls.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest
from shared_helpers import tiny_args

from grpokit import GRPOConfig, GRPOTrainer
from grpokit.cli import main
from grpokit.store import RolloutStore
from grpokit.testing.tools import qwen_style_tokenizer, scripted_chat_lm

pytestmark = pytest.mark.usefixtures("one_thread")

HERE = Path(__file__).parent
TOOLS = HERE / "tools_for_tests.py"
END = "<|im_end|>"
CALL = '<tool_call>\n{"name": "multiply", "arguments": {"a": 6, "b": 7}}\n</tool_call>' + END
ANSWER = "The answer is ##." + END
# what the template adds after the call: the tool result in a user turn, then the next assistant header
SUFFIX = f"\n<|im_start|>user\n<tool_response>\n42\n</tool_response>{END}\n<|im_start|>assistant\n"


def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: The first factor.
        b: The second factor.
    """
    return a * b


def closeness(completions, **kwargs):
    """How close the final answer's number is to 42 (the two digits the scripted model chooses)."""
    out = []
    for completion in completions:
        digits = "".join(ch for ch in completion[-1]["content"] if ch.isdigit())
        out.append(-abs(int(digits or 0) - 42) / 100)
    return out


def chat_rows(n: int = 8) -> list[dict]:
    return [{"prompt": [{"role": "user", "content": f"What is 6 times {7 + i}?"}], "factor": 7 + i} for i in range(n)]


settings = functools.partial(
    tiny_args, max_completion_length=160, learning_rate=1e-2, save_strategy="no", reward_timeout=60.0
)


def metrics(run: Path) -> list[dict]:
    """The training steps' lines of metrics.jsonl (not the evaluations')."""
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [m for m in lines if "loss" in m]


def test_trains_with_a_tool_through_the_api(tmp_path, capsys):
    """TRL's tools=[fn]: each rollout calls multiply, reads 42, answers; the loss covers the model's tokens only,
    the rewards get the messages, the store keeps the turns, inspect and the report show them."""
    tokenizer = qwen_style_tokenizer()
    seen = []

    def record(prompts, completions, completion_ids, **kwargs):
        seen.append({"prompts": prompts, "completions": completions, "ids": completion_ids, "keys": set(kwargs)})
        return [0.0] * len(completions)

    run = tmp_path / "run"
    trainer = GRPOTrainer(
        scripted_chat_lm(tokenizer, [CALL, ANSWER]),
        [closeness, record],
        args=settings(run, beta=0.04, loss_type="grpo", reward_isolation=False),  # record keeps what it saw here
        train_dataset=chat_rows(),
        processing_class=tokenizer,
        tools=[multiply],
    )
    updates = []
    update = trainer.learner.update

    def spy(batch, advantages, loss_mask, *args, **kwargs):
        updates.append((batch.completion_ids.clone(), batch.completion_mask.clone(), loss_mask.clone(), kwargs))
        return update(batch, advantages, loss_mask, *args, **kwargs)

    trainer.learner.update = spy
    trainer.train()

    # the loss mask: exactly the model's tokens (the call, then the answer), never the tool result or the template's
    # tokens, and the dapo/grpo token counts are of those tokens
    call_ids = tokenizer.encode(CALL, add_special_tokens=False)
    suffix_ids = tokenizer.encode(SUFFIX, add_special_tokens=False)
    for ids, completion_mask, loss_mask, kwargs in updates:
        assert kwargs["num_items_in_batch"] == loss_mask.sum()
        for row in range(ids.size(0)):
            sampled = ids[row][loss_mask[row].bool()].tolist()
            added = ids[row][(completion_mask[row] - loss_mask[row]).bool()].tolist()
            assert added == suffix_ids
            assert sampled[: len(call_ids)] == call_ids
            answer = tokenizer.decode(sampled[len(call_ids) :], skip_special_tokens=False)
            assert answer.startswith("The answer is ") and answer.endswith(f".{END}")

    # rewards: TRL's conversational completions of a tool rollout, completion_ids every token after the prompt
    first = seen[0]
    assert len(first["completions"]) == 8 and "environments" not in first["keys"]
    messages = first["completions"][0]
    assert [m["role"] for m in messages] == ["assistant", "tool", "assistant"]
    assert messages[0]["tool_calls"][0]["function"] == {"name": "multiply", "arguments": {"a": 6, "b": 7}}
    assert messages[1] == {"role": "tool", "name": "multiply", "content": "42"}
    assert messages[2]["content"].startswith("The answer is ")
    assert tokenizer.decode(first["ids"][0], skip_special_tokens=False).count("<tool_response>") == 1
    assert all(
        prompt in [row["prompt"] for row in chat_rows()] for prompt in first["prompts"]
    )  # as the dataset has them

    logged = metrics(run)
    assert [m["tools/call_frequency"] for m in logged] == [1.0, 1.0]
    assert [m["tools/failure_frequency"] for m in logged] == [0.0, 0.0]
    assert all(m["grad_norm"] > 0 for m in logged)  # the free digits differ within a group: advantages are not 0
    # completion lengths count the model's tokens, as TRL's do
    assert logged[0]["completion_length/mean"] == pytest.approx(float(updates[0][2].sum(1).mean()))

    with RolloutStore(run, readonly=True) as store:
        stored = store.rollouts(step=1)
    conversation = stored[0]["conversation"]
    assert conversation["stop_reason"] == "answered" and conversation["tool_rounds"] == 1
    assistant, tool, answer = conversation["turns"]
    assert assistant["role"] == "assistant" and assistant["tool_calls"][0]["name"] == "multiply"
    assert (tool["role"], tool["name"], tool["arguments"], tool["status"], tool["text"]) == (
        "tool",
        "multiply",
        {"a": 6, "b": 7},
        "ok",
        "42",
    )
    assert tool["duration"] >= 0 and tool["start"] >= 0 and answer["text"].startswith("The answer is ")

    assert main(["inspect", str(run), "--step", "1"]) == 0
    shown = capsys.readouterr().out
    assert '[tool] multiply({"a": 6, "b": 7}) -> ok' in shown and "ended: answered after 1 tool round" in shown
    assert 'class="tool"' in (run / "report.html").read_text()


class Multiplies:
    """The tool of this module's environments (their methods are their tools): multiply, each call kept in calls."""

    def multiply(self, a: int, b: int) -> int:
        """Multiply two integers.

        Args:
            a: The first factor.
            b: The second factor.
        """
        self.calls.append((a, b))
        return a * b


class Calculator(Multiplies):
    """An environment: multiply is its tool; get_reward says whether the rollout used it on the row's numbers."""

    def reset(self, factor: int, **row) -> str:
        self.factor, self.calls = factor, []
        return " Use the calculator."

    def get_reward(self) -> float:
        return float(len(self.calls) == 1)


def test_environment_instances_reach_the_rewards(tmp_path):
    """environment_factory: one reset instance per rollout, its methods the tools; rewards that name
    `environments` get the instances (in this process), get_reward is a reward of its own, and a reward in a
    worker process is never sent them."""
    tokenizer = qwen_style_tokenizer()
    seen = []

    def uses_environments(environments, prompts, completions, **kwargs):
        seen.append((list(environments), prompts))
        return [float(e.calls == [(6, 7)]) for e in environments]

    def in_a_worker(completions, **kwargs):
        return [float("environments" in kwargs)] * len(completions)

    run = tmp_path / "run"
    trainer = GRPOTrainer(
        scripted_chat_lm(tokenizer, [CALL, ANSWER]),
        [uses_environments, in_a_worker],
        # reward_isolation: in_a_worker in a worker process (functions from Python run here by default, as in TRL)
        args=settings(
            run, max_steps=1, beta=0.0, eval_steps=1, num_generations_eval=2, pass_at_k=[1], reward_isolation=True
        ),
        train_dataset=chat_rows(),
        eval_dataset=chat_rows(2),
        processing_class=tokenizer,
        environment_factory=Calculator,
    )
    trainer.train()
    # evaluation samples tool rollouts too: before and after training, sampled and greedy
    evaluations = [
        json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if "eval/reward" in line
    ]
    assert len(evaluations) == 2 and all(e["eval/reward"] == 2.0 for e in evaluations)  # uses_environments + get_reward
    assert trainer.evaluate()["eval_reward"] == 2.0  # after train(), which closed the tool workers
    seen = [call for call in seen if len(call[0]) == 8]  # the training step's call (evaluation calls have 4 or 2)
    ((environments, prompts),) = seen
    assert len(environments) == 8 and len({id(e) for e in environments}) == 8
    assert all(isinstance(e, Calculator) and e.calls == [(6, 7)] for e in environments)
    assert prompts[0][-1]["content"].endswith("? Use the calculator.")  # the reset observation, as TRL passes it
    (step,) = metrics(run)
    assert step["rewards/uses_environments/mean"] == 1.0
    assert step["rewards/Calculator/mean"] == 1.0  # get_reward, named after the class (TRL)
    assert step["rewards/in_a_worker/mean"] == 0.0
    assert step["tools/call_frequency"] == 1.0


RESETS: list[dict] = []  # what every GuessTheProduct.reset() was called with


class GuessTheProduct(Multiplies):
    """An environment that owns the data (no train_dataset): reset() gives each rollout its prompt."""

    def reset(self, **row) -> str:
        RESETS.append(row)
        self.calls = []
        return "What is 6 times 7?"

    def get_reward(self) -> float:
        return float(self.calls == [(6, 7)])


def test_the_environment_owns_the_data(tmp_path):
    """TRL's environment-owned data: without a train_dataset each rollout's prompt is its environment's reset()
    (appended to an empty user message, as TRL does) and max_steps sets the run's length."""
    tokenizer = qwen_style_tokenizer()
    seen = []

    def record(prompts, completions, **kwargs):
        seen.append(prompts)
        return [0.0] * len(completions)

    RESETS.clear()
    run = tmp_path / "run"
    trainer = GRPOTrainer(
        scripted_chat_lm(tokenizer, [CALL, ANSWER]),
        [closeness, record],
        args=settings(run, max_steps=2, beta=0.0),
        processing_class=tokenizer,
        environment_factory=GuessTheProduct,
    )
    trainer.train()
    assert trainer.state.global_step == 2
    assert [len(batch) for batch in seen] == [8, 8]  # 2 prompts x 4 generations per step
    assert all(prompt == [{"role": "user", "content": "What is 6 times 7?"}] for batch in seen for prompt in batch)
    assert RESETS == [{"prompt": [{"role": "user", "content": ""}]}] * 16  # TRL's placeholder row
    assert all(isinstance(e, GuessTheProduct) and e.calls == [(6, 7)] for e in trainer.environments)
    steps = metrics(run)
    assert [m["rewards/GuessTheProduct/mean"] for m in steps] == [1.0, 1.0]  # the tool was called with 6 and 7
    assert [m["tools/call_frequency"] for m in steps] == [1.0, 1.0]


class AskSevenTimesSix(GuessTheProduct):
    def reset(self, **row) -> str:
        super().reset(**row)
        return "What is 7 times 6?"


def test_a_dataset_may_only_route_rows_to_environments(tmp_path):
    """TRL: with a {name: factory} dict the rows may hold only their `environment`; each rollout's prompt is then its
    environment's reset() (appended to an empty user message)."""
    tokenizer = qwen_style_tokenizer()
    seen = []

    def record(prompts, environments, **kwargs):
        seen.extend(zip([p[-1]["content"] for p in prompts], [type(e).__name__ for e in environments]))
        return [0.0] * len(prompts)

    RESETS.clear()
    trainer = GRPOTrainer(
        scripted_chat_lm(tokenizer, [CALL, ANSWER]),
        [closeness, record],
        args=settings(tmp_path / "run", max_steps=1, beta=0.0, shuffle=False),
        train_dataset=[{"environment": "six"}, {"environment": "seven"}] * 4,
        processing_class=tokenizer,
        environment_factory={"six": GuessTheProduct, "seven": AskSevenTimesSix},
    )
    trainer.train()
    questions = {"GuessTheProduct": "What is 6 times 7?", "AskSevenTimesSix": "What is 7 times 6?"}
    assert len(seen) == 8 and {name for _, name in seen} == set(questions)
    assert all(prompt == questions[name] for prompt, name in seen)
    assert RESETS == [{"prompt": [{"role": "user", "content": ""}]}] * 8  # no `environment`: it only routes


def test_without_a_dataset_the_environment_must_own_the_data(tmp_path):
    """TRL's errors, with its words and grpokit's fix, before any model loads (the model path does not exist)."""
    model = str(tmp_path / "no-such-model")
    no_max_steps = GRPOConfig(output_dir=str(tmp_path / "run"), num_generations=4, per_device_train_batch_size=8)
    with pytest.raises(ValueError, match=r"max_steps must be set to a positive value when the environment owns"):
        GRPOTrainer(model, closeness, args=no_max_steps, environment_factory=GuessTheProduct)
    args = settings(tmp_path / "run", max_steps=1)
    with pytest.raises(ValueError, match=r"A `dict` `environment_factory` .* requires a `train_dataset`"):
        GRPOTrainer(model, closeness, args=args, environment_factory={"a": GuessTheProduct, "b": GuessTheProduct})
    with pytest.raises(ValueError, match=r"`train_dataset` is required unless an `environment_factory` is provided"):
        GRPOTrainer(model, closeness, args=args)


@pytest.fixture(scope="module")
def qwen_dir(tmp_path_factory):
    """A random tiny Llama (the fused decoder, the kept KV cache) with the Qwen-style tool template; about one token
    in seven ends a turn (its EOS ids), so its turns are short and a rollout has several. (Not Qwen2: transformers'
    AutoTokenizer would load a qwen2 folder's tokenizer as Qwen2's own class, not this byte-level one.)"""
    from grpokit.testing import build_tiny_causal_lm

    path = tmp_path_factory.mktemp("tiny-llama-tools")
    tokenizer = qwen_style_tokenizer()
    model, _ = build_tiny_causal_lm(
        None, tokenizer, arch="llama", hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1, max_positions=2048
    )
    model.generation_config.eos_token_id = list(range(0, 262, 7))
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def test_cli_trains_with_tools_from_the_config(tmp_path, qwen_dir, capsys):
    """The agent section of a YAML config: tools and the parser by path, max_tool_calling_iterations."""
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in chat_rows()))
    config = tmp_path / "config.yaml"
    config.write_text(
        f"model: {{model_name_or_path: {qwen_dir}}}\n"
        f"data: {{train_dataset: {data}}}\n"
        f"rewards: ['{TOOLS}:answer_has_digit']\n"
        "agent:\n"
        f"  tools: ['{TOOLS}:multiply']\n"
        f"  tool_parser: '{TOOLS}:every_other_turn'\n"
        "  max_tool_calling_iterations: 2\n"
        "  tool_workers: 2\n"
    )
    run = tmp_path / "run"
    overrides = [
        f"output_dir={run}",
        "num_generations=4",
        "per_device_train_batch_size=8",
        "max_steps=2",
        "max_completion_length=96",
        "learning_rate=1e-3",
        "save_strategy=no",
        "progress_bar=false",
        "report_to=[jsonl]",
    ]
    assert main(["train", str(config), *overrides]) == 0
    with RolloutStore(run, readonly=True) as store:
        rollouts = store.rollouts()
    conversations = [r["conversation"] for r in rollouts]
    rounds = [c["tool_rounds"] for c in conversations]
    assert max(rounds) >= 1 and max(rounds) <= 2 and min(rounds) < max(rounds)
    tools = [t for c in conversations for t in c["turns"] if t["role"] == "tool"]
    assert tools and all(t["name"] == "multiply" and t["status"] == "ok" for t in tools)
    assert all(t["text"] == str(t["arguments"]["a"] * 3) for t in tools)  # the tool ran, in a worker process
    assert {c["stop_reason"] for c in conversations} <= {"answered", "max_iterations", "length"}
    logged = metrics(run)
    assert all(m["tools/call_frequency"] > 0 for m in logged)
    with_tools = next(r for r in rollouts if r["conversation"]["tool_rounds"])
    capsys.readouterr()
    assert (
        main(["inspect", str(run), "--step", str(with_tools["step"]), "--prompt", str(with_tools["prompt_index"])]) == 0
    )
    assert "[tool] multiply" in capsys.readouterr().out


# ---- exact resume --------------------------------------------------------------------------------------------
COMPARED = ("loss", "policy_loss", "kl", "grad_norm", "entropy", "reward", "completion_logprob_mean")


def resumable(run: Path, qwen_dir: Path, **overrides) -> GRPOTrainer:
    values = dict(
        max_steps=4,
        max_completion_length=96,
        learning_rate=1e-3,
        lr_scheduler_type="constant",
        algo={"num_iterations": 2},  # grpokit's form: max_steps counts generation batches
        save_strategy="steps",
        save_steps=1,
        tool_parser=f"{TOOLS}:every_other_turn",
        max_tool_calling_iterations=2,
    )
    args = settings(run, **(values | overrides))
    reward = f"{TOOLS}:answer_has_digit"
    return GRPOTrainer(str(qwen_dir), reward, args=args, train_dataset=chat_rows(), tools=[multiply])


def stored(run: Path) -> list[tuple]:
    """Each stored rollout with its turns, without their wall-clock times."""
    with RolloutStore(run, readonly=True) as store:
        rows = store.rollouts()
    untimed = lambda c: [{k: v for k, v in t.items() if k not in ("start", "duration")} for t in c["turns"]]
    return [(r["step"], r["prompt_index"], r["completion"], untimed(r["conversation"])) for r in rows]


def test_resume_with_multi_turn_rollouts_is_exact(tmp_path, qwen_dir):
    """4 steps in one go equal 2 steps, then a resume to 4: same rollouts (turns, tool results), same numbers."""
    straight, split = tmp_path / "straight", tmp_path / "split"
    resumable(straight, qwen_dir).train()
    resumable(split, qwen_dir, max_steps=2).train()
    resumable(split, qwen_dir, resume_from="latest").train()
    a, b = metrics(straight), metrics(split)
    assert [m["step"] for m in a] == [m["step"] for m in b] == [1, 2, 3, 4]
    for x, y in zip(a, b):
        for key in COMPARED:
            assert x[key] == pytest.approx(y[key], abs=1e-6), (x["step"], key)
    rollouts = stored(straight)
    assert rollouts == stored(split)
    assert any(len(turns) > 1 for *_, turns in rollouts)  # tool rounds happened


# ---- a TRL agent script --------------------------------------------------------------------------------------
TRL_AGENT_SCRIPT = '''
from datasets import Dataset
from trl import GRPOConfig, GRPOTrainer


def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: The first factor.
        b: The second factor.
    """
    return a * b


dataset = Dataset.from_list(
    [{"prompt": [{"role": "user", "content": f"What is 6 times {i}?"}], "answer": 6 * i} for i in range(8)]
)


def correct(completions, answer, **kwargs):
    return [float(str(a) in completion[-1]["content"]) for completion, a in zip(completions, answer)]


training_args = GRPOConfig(
    output_dir=OUTPUT_DIR,
    num_generations=4,
    per_device_train_batch_size=8,
    max_completion_length=160,
    max_tool_calling_iterations=2,
    learning_rate=1e-4,
    max_steps=2,
    logging_steps=1,
    report_to="none",
    save_strategy="no",
    bf16=False,
    seed=0,
)
trainer = GRPOTrainer(
    model=MODEL,
    processing_class=TOKENIZER,
    reward_funcs=[correct, record_reward],
    args=training_args,
    train_dataset=dataset,
    tools=[multiply],
)
trainer.train()
'''


def test_a_trl_agent_script_runs_with_the_import_changed(tmp_path):
    """A script written for TRL 1.16's GRPOTrainer(tools=[...]) runs on grpokit with `from grpokit import`."""
    tokenizer = qwen_style_tokenizer()
    calls = tmp_path / "calls.jsonl"

    def record_reward(completions, **kwargs):  # what it saw goes to a file
        with open(calls, "a") as f:
            f.write(json.dumps(completions) + "\n")
        return [0.0] * len(completions)

    source = TRL_AGENT_SCRIPT.replace(
        "from trl import GRPOConfig, GRPOTrainer", "from grpokit import GRPOConfig, GRPOTrainer"
    )
    assert source != TRL_AGENT_SCRIPT
    namespace = {
        "MODEL": scripted_chat_lm(tokenizer, [CALL, ANSWER]),
        "TOKENIZER": tokenizer,
        "OUTPUT_DIR": str(tmp_path / "out"),
        "record_reward": record_reward,
        "__name__": "__main__",
    }
    exec(compile(source, "<TRL agent script on grpokit>", "exec"), namespace)
    history = [h for h in namespace["trainer"].state.log_history if "tools/call_frequency" in h]
    assert [h["tools/call_frequency"] for h in history] == [1.0, 1.0]
    seen = [json.loads(line) for line in calls.read_text().splitlines()]
    assert len(seen) == 2 and all(len(batch) == 8 for batch in seen)
    assert all([m["role"] for m in completion] == ["assistant", "tool", "assistant"] for completion in seen[0])
    assert seen[0][0][1] == {"role": "tool", "name": "multiply", "content": "42"}


def test_bad_tool_setups_are_refused_before_training(tmp_path, tiny_model_dir):
    """String prompts, an undocumented tool, and a chat template that cannot render tool rounds: each a clear error."""
    from grpokit.config import ConfigError
    from grpokit.data.prompts import DataError

    args = settings(tmp_path / "run", max_steps=1)
    with pytest.raises(DataError, match="must hold chat messages"):
        GRPOTrainer(
            str(tiny_model_dir), closeness, args=args, train_dataset=[{"prompt": "w1 w2"}] * 8, tools=[multiply]
        )
    with pytest.raises(ConfigError, match=r"agent: .*docstring"):
        GRPOTrainer(str(tiny_model_dir), closeness, args=args, train_dataset=chat_rows(), tools=[lambda x: x])
    with pytest.raises(ConfigError, match="agent: the chat template does not close an assistant turn"):
        GRPOTrainer(str(tiny_model_dir), closeness, args=args, train_dataset=chat_rows(), tools=[multiply])
