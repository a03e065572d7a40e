"""A TRL user's GRPO script runs on grpokit by changing one import.

Each script below is written to TRL's GRPOTrainer documentation (a ``datasets.Dataset``, reward functions
taking ``completions`` and the dataset's columns as keywords, TRL's config keys, ``trl.rewards``
functions, ``peft_config``, ``callbacks``). The test runs its text twice in the same process, once after
``from trl import GRPOConfig, GRPOTrainer`` and once after ``from grpokit import GRPOConfig, GRPOTrainer``,
on a tiny local Llama-style model. A recording reward function in every script keeps what each library
passed to it; grpokit must pass the same keyword names, with values of the same types, aligned the same
way (one entry per completion, the G completions of a prompt next to each other, each column's value
the one of that completion's row, ``completion_ids`` the tokens of ``completions``), as TRL does.
"""

from __future__ import annotations

import json

import pytest
from shared_helpers import CHAT_TEMPLATE, WORDS

trl = pytest.importorskip(
    "trl", reason="the migration suite runs the same scripts under TRL: pip install 'grpokit[bench]'"
)
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]

G = 4
COMMON_ARGS = (
    "output_dir=OUTPUT_DIR, num_generations=4, per_device_train_batch_size=8, max_completion_length=8, "
    'learning_rate=1e-4, logging_steps=1, report_to="none", save_strategy="no", bf16=False, seed=0'
)

STANDARD = f"""
from datasets import Dataset

dataset = Dataset.from_list(
    [{{"prompt": f"w{{i}} w{{i + 1}} w{{i + 2}}", "ground_truth": f"w{{i + 3}}"}} for i in range(8)]
)


def reward_len(completions, **kwargs):
    return [-abs(4 - len(completion.split())) / 4 for completion in completions]


def reward_match(completions, ground_truth, **kwargs):
    return [float(truth in completion.split()) for completion, truth in zip(completions, ground_truth)]


training_args = GRPOConfig({COMMON_ARGS}, max_steps=2, reward_weights=[1.0, 2.0, 0.0])
trainer = GRPOTrainer(
    model=MODEL,
    reward_funcs=[reward_len, reward_match, record_reward],
    args=training_args,
    train_dataset=dataset,
)
result = trainer.train()
"""

CONVERSATIONAL = f"""
from datasets import Dataset
from trl.rewards import get_soft_overlong_punishment, think_format_reward

dataset = Dataset.from_list(
    [
        {{"prompt": [{{"role": "user", "content": f"w{{i}} w{{i + 1}}"}}], "ground_truth": f"w{{i + 2}}"}}
        for i in range(8)
    ]
)


def reward_first_word(completions, ground_truth, **kwargs):
    contents = [completion[0]["content"] for completion in completions]
    return [float(content.split()[:1] == [truth]) for content, truth in zip(contents, ground_truth)]


training_args = GRPOConfig({COMMON_ARGS}, max_steps=2)
trainer = GRPOTrainer(
    model=MODEL,
    reward_funcs=[reward_first_word, think_format_reward, get_soft_overlong_punishment(8, 4), record_reward],
    args=training_args,
    train_dataset=dataset,
)
trainer.train()
"""

PEFT = f"""
from datasets import Dataset
from peft import LoraConfig

dataset = Dataset.from_list([{{"prompt": f"w{{i}} w{{i + 1}} w{{i + 2}}"}} for i in range(8)])


def reward_len(completions, **kwargs):
    return [-abs(4 - len(completion.split())) / 4 for completion in completions]


peft_config = LoraConfig(
    r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"
)
training_args = GRPOConfig({COMMON_ARGS}, max_steps=1)
trainer = GRPOTrainer(
    model=MODEL,
    reward_funcs=[reward_len, record_reward],
    args=training_args,
    train_dataset=dataset,
    peft_config=peft_config,
)
trainer.train()
"""

CALLBACKS = f"""
from datasets import Dataset
from transformers import TrainerCallback

dataset = Dataset.from_list([{{"prompt": f"w{{i}} w{{i + 1}} w{{i + 2}}"}} for i in range(8)])


def reward_len(completions, **kwargs):
    return [-abs(4 - len(completion.split())) / 4 for completion in completions]


class StopAfterTwoSteps(TrainerCallback):
    def __init__(self):
        self.events = []
        self.logs = []

    def on_train_begin(self, args, state, control, **kwargs):
        self.events.append(("train_begin", state.global_step))

    def on_epoch_begin(self, args, state, control, **kwargs):
        self.events.append(("epoch_begin", state.global_step))

    def on_step_begin(self, args, state, control, **kwargs):
        self.events.append(("step_begin", state.global_step))

    def on_step_end(self, args, state, control, **kwargs):
        self.events.append(("step_end", state.global_step))
        if state.global_step >= 2:
            control.should_training_stop = True

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.events.append(("log", state.global_step))
        self.logs.append(logs)

    def on_epoch_end(self, args, state, control, **kwargs):
        self.events.append(("epoch_end", state.global_step))

    def on_train_end(self, args, state, control, **kwargs):
        self.events.append(("train_end", state.global_step))


stopper = StopAfterTwoSteps()
training_args = GRPOConfig({COMMON_ARGS}, max_steps=5)
trainer = GRPOTrainer(model=MODEL, reward_funcs=[reward_len, record_reward], args=training_args, train_dataset=dataset,
                      callbacks=[stopper])
trainer.train()
"""

REWARD_MODEL = f"""
from datasets import Dataset

dataset = Dataset.from_list(
    [{{"prompt": f"w{{i}} w{{i + 1}} w{{i + 2}}", "ground_truth": f"w{{i + 3}}"}} for i in range(8)]
)

training_args = GRPOConfig({COMMON_ARGS}, max_steps=2)
trainer = GRPOTrainer(
    model=MODEL,
    reward_funcs=[REWARD_MODEL, record_reward],  # a string: the reward model's folder (or Hub id)
    args=training_args,
    train_dataset=dataset,
)
trainer.train()
"""

REWARD_MODEL_CONVERSATIONAL = f"""
from datasets import Dataset
from transformers import AutoTokenizer

dataset = Dataset.from_list([{{"prompt": [{{"role": "user", "content": f"w{{i}} w{{i + 1}}"}}]}} for i in range(8)])

training_args = GRPOConfig({COMMON_ARGS}, max_steps=2)
trainer = GRPOTrainer(
    model=MODEL,
    reward_funcs=[REWARD_MODEL, record_reward],
    args=training_args,
    train_dataset=dataset,
    reward_processing_classes=[AutoTokenizer.from_pretrained(REWARD_MODEL), None],
)
trainer.train()
"""

# TRL's documented pattern of a reward with side effects: it counts its calls in a list it closes over, and reads a
# curriculum level that a callback raises after every step.
SIDE_EFFECTS = f"""
from datasets import Dataset
from transformers import TrainerCallback

dataset = Dataset.from_list([{{"prompt": f"w{{i}} w{{i + 1}} w{{i + 2}}"}} for i in range(8)])
calls = []
curriculum = {{"level": 0}}


def reward_len(completions, **kwargs):
    calls.append((len(completions), curriculum["level"]))
    return [-abs(curriculum["level"] + 2 - len(completion.split())) / 4 for completion in completions]


class RaiseTheLevel(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        curriculum["level"] += 1


training_args = GRPOConfig({COMMON_ARGS}, max_steps=3)
trainer = GRPOTrainer(
    model=MODEL,
    reward_funcs=[reward_len, record_reward],
    args=training_args,
    train_dataset=dataset,
    callbacks=[RaiseTheLevel()],
)
trainer.train()
"""

SCRIPTS = {
    "standard": STANDARD,
    "conversational": CONVERSATIONAL,
    "peft": PEFT,
    "callbacks": CALLBACKS,
    "reward_model": REWARD_MODEL,
    "reward_model_conversational": REWARD_MODEL_CONVERSATIONAL,
    "side_effects": SIDE_EFFECTS,
}
STEPS = {"peft": 1, "side_effects": 3}  # global_step after each script's train(); 2 for the others


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A random-init 2-layer Llama with a word-level tokenizer and a chat template, saved to a folder. (Not
    Qwen2: transformers 5's AutoTokenizer loads a qwen2 folder's tokenizer as Qwen2's own class, which
    reads this word-level vocabulary as nothing; both libraries load the tokenizer from the folder.)"""
    from grpokit.testing import build_tiny_causal_lm, build_word_tokenizer

    path = tmp_path_factory.mktemp("tiny-llama")
    tokenizer = build_word_tokenizer([*WORDS, "user", "assistant", "system", ":", "<think>", "</think>"])
    tokenizer.chat_template = CHAT_TEMPLATE
    build_tiny_causal_lm(path, tokenizer, arch="llama", hidden_size=32, num_layers=2, num_heads=2)
    return path


def describe(value, top: bool = True):
    """The shape of a reward argument: types all the way down, the length of the outer list only; for
    ``trainer_state`` the types of the fields TRL's rewards read (grpokit passes a lighter object)."""
    if hasattr(value, "global_step"):  # TRL's epoch starts as the int 0
        return ["state", *(type(getattr(value, name)).__name__ for name in ("global_step", "max_steps")), "number"]
    if isinstance(value, list):
        inner = describe(value[0], top=False) if value else None
        return ["list", len(value), inner] if top else ["list", inner]
    if isinstance(value, dict):
        return {k: describe(v, top=False) for k, v in sorted(value.items())}
    if callable(value):
        return "callable"
    return type(value).__name__


@pytest.fixture(scope="module")
def reward_model_dir(model_dir, tmp_path_factory):
    """A tiny one-output sequence classifier over the policy's word tokenizer, saved to a folder `tiny-judge-rm`."""
    from transformers import AutoTokenizer

    from grpokit.testing import build_tiny_reward_model

    path = tmp_path_factory.mktemp("reward-models") / "tiny-judge-rm"
    build_tiny_reward_model(path, AutoTokenizer.from_pretrained(model_dir))
    return path


def run(script: str, library: str, model_dir, out_dir, reward_model_dir) -> tuple[dict, list[dict]]:
    """Run ``script`` after ``from <library> import GRPOConfig, GRPOTrainer``; (its namespace, the recorded calls).

    The recording reward appends each call to a file, which stays readable if a run isolates its rewards."""
    log = out_dir / "reward_calls.jsonl"

    def record_reward(**kwargs):
        data = {k: v for k, v in kwargs.items() if isinstance(v, list)}
        with open(log, "a") as f:
            f.write(
                json.dumps(
                    {
                        "kwargs": data,
                        "shape": {k: describe(v) for k, v in kwargs.items()},
                        "global_step": kwargs["trainer_state"].global_step,
                    }
                )
                + "\n"
            )
        kwargs["log_metric"]("recorded", 1.0)
        return [0.0] * len(kwargs["completions"])

    source = f"from {library} import GRPOConfig, GRPOTrainer\n" + SCRIPTS[script]
    namespace = {
        "MODEL": str(model_dir),
        "REWARD_MODEL": str(reward_model_dir),
        "OUTPUT_DIR": str(out_dir),
        "record_reward": record_reward,
        "__name__": "__main__",
    }
    exec(compile(source, f"<{script} script on {library}>", "exec"), namespace)
    calls = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return namespace, sorted(calls, key=lambda call: call["global_step"])


def prompt_key(prompt) -> str:
    return prompt if isinstance(prompt, str) else prompt[-1]["content"]


def check_alignment(calls: list[dict], namespace: dict, tokenizer) -> None:
    """What TRL's own contract promises, checked on one library's calls."""
    rows = {prompt_key(row["prompt"]): row for row in namespace["dataset"].to_list()}
    assert [c["global_step"] for c in calls] == list(range(len(calls)))  # steps done before each call
    for call in calls:
        kw = call["kwargs"]
        n = len(kw["completions"])
        assert n == 8
        for key, value in kw.items():
            if isinstance(value, list):
                assert len(value) == n, key
        for i in range(n):
            assert prompt_key(kw["prompts"][i]) == prompt_key(
                kw["prompts"][i - i % G]
            )  # the G of a prompt are adjacent
            row = rows[prompt_key(kw["prompts"][i])]
            assert kw["prompts"][i] == row["prompt"]
            for column in set(row) - {"prompt"}:
                assert kw[column][i] == row[column], column
            completion = kw["completions"][i]
            text = completion if isinstance(completion, str) else completion[0]["content"]
            assert tokenizer.decode(kw["completion_ids"][i], skip_special_tokens=True).strip() == text.strip()


@pytest.fixture(scope="module")
def runs(model_dir, reward_model_dir, tmp_path_factory):
    """Every script under both libraries, once per module: {(script, library): (namespace, calls)}."""
    import torch

    cache = {}

    def get(script: str, library: str):
        if (script, library) not in cache:
            torch.manual_seed(0)
            out_dir = tmp_path_factory.mktemp(f"{script}-{library}")
            cache[script, library] = run(script, library, model_dir, out_dir, reward_model_dir)
        return cache[script, library]

    return get


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_grpokit_passes_what_trl_passes(script, runs, model_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    theirs_ns, theirs = runs(script, "trl")
    ours_ns, ours = runs(script, "grpokit")
    assert len(ours) == len(theirs) > 0
    for mine, trls in zip(ours, theirs):
        # TRL's keyword names, plus one grpokit documents (docs/from_trl.md): completion_lengths, token counts
        assert set(mine["shape"]) - set(trls["shape"]) == {"completion_lengths"}
        assert set(trls["shape"]) <= set(mine["shape"])
        assert {k: mine["shape"][k] for k in trls["shape"]} == trls["shape"]  # the same value types and lengths
    check_alignment(theirs, theirs_ns, tokenizer)  # the contract holds for TRL ...
    check_alignment(ours, ours_ns, tokenizer)  # ... and for grpokit
    for namespace in (theirs_ns, ours_ns):
        state = namespace["trainer"].state
        assert state.global_step == STEPS.get(script, 2)
        assert any(key.endswith("recorded") for key in state.log_history[0])  # log_metric reached the step's metrics


def test_conversational_completions_are_messages(runs):
    _, ours = runs("conversational", "grpokit")
    completion = ours[0]["kwargs"]["completions"][0]
    assert (
        isinstance(completion, list)
        and completion[0]["role"] == "assistant"
        and isinstance(completion[0]["content"], str)
    )


def test_reward_weights_combine_as_in_trl(runs):
    for library in ("trl", "grpokit"):
        first = runs("standard", library)[0]["trainer"].state.log_history[0]
        expected = first["rewards/reward_len/mean"] + 2.0 * first["rewards/reward_match/mean"]
        assert first["reward"] == pytest.approx(expected, abs=1e-5), library


def test_train_returns_what_trl_returns(runs):
    """transformers' TrainOutput with TRL's metric names (grpokit counts no FLOPs: no total_flos)."""
    ours, theirs = runs("standard", "grpokit")[0]["result"], runs("standard", "trl")[0]["result"]
    assert type(ours) is type(theirs) and ours.global_step == theirs.global_step == 2
    assert set(ours.metrics) == set(theirs.metrics) - {"total_flos"}
    assert ours.metrics["epoch"] == pytest.approx(theirs.metrics["epoch"]) == 0.5  # 2 steps of 2 of 8 prompts
    for result in (ours, theirs):
        assert result.training_loss == result.metrics["train_loss"]


def test_peft_trains_only_the_adapters(runs):
    for library in ("trl", "grpokit"):
        model = runs("peft", library)[0]["trainer"].model
        trained = [name for name, p in model.named_parameters() if p.requires_grad]
        assert trained and all("lora_" in name for name in trained), library
        assert {name.split(".lora_")[0].rsplit(".", 1)[-1] for name in trained} == {"q_proj", "v_proj"}, library


def test_callbacks_see_the_same_events(runs):
    theirs = runs("callbacks", "trl")[0]["stopper"]
    ours = runs("callbacks", "grpokit")[0]["stopper"]
    assert ours.events == theirs.events
    assert ours.events[-1] == ("train_end", 2)
    assert "reward" in ours.logs[0] and "train_runtime" in ours.logs[-1]
    for mine, trls in zip(ours.logs, theirs.logs):
        assert mine["epoch"] == pytest.approx(trls["epoch"])  # 8 prompts, 2 per step: a quarter epoch per step
        assert {"reward", "reward_std", "loss", "entropy", "learning_rate"} & set(trls) <= set(mine)  # TRL's names


@pytest.mark.parametrize("script", ["reward_model", "reward_model_conversational"])
def test_a_reward_model_named_by_a_string_is_scored_as_trl_scores_it(script, runs):
    """A folder in reward_funcs is TRL's reward model: the same name in the metrics, and on grpokit's own completions
    TRL's scoring code (its trainer's _calculate_rewards, chat template for messages, logits[:, 0]) gives the values
    grpokit logged."""
    theirs_ns, _ = runs(script, "trl")
    ours_ns, ours = runs(script, "grpokit")
    name = "tiny-judge-rm"
    for namespace in (theirs_ns, ours_ns):
        assert name in namespace["trainer"].reward_func_names
        assert f"rewards/{name}/mean" in namespace["trainer"].state.log_history[0]
    trl_trainer = theirs_ns["trainer"]
    index = trl_trainer.reward_func_names.index(name)
    trl_trainer.reward_funcs = [trl_trainer.reward_funcs[index]]  # TRL's scorer with the reward model alone
    trl_trainer.reward_processing_classes = [trl_trainer.reward_processing_classes[index]]
    trl_trainer.reward_func_names = [name]
    kw = ours[0]["kwargs"]  # what grpokit's first step gave its rewards: the reward model saw the same
    n = len(kw["completions"])
    expected = trl_trainer._calculate_rewards([{}] * n, kw["prompts"], kw["completions"], kw["completion_ids"])
    logged = ours_ns["trainer"].state.log_history[0][f"rewards/{name}/mean"]
    assert logged == pytest.approx(expected[:, 0].float().mean().item(), abs=1e-4)


def test_rewards_given_from_python_run_where_the_script_sees_their_side_effects(runs):
    """As in TRL, a reward function passed from Python runs in the script's process: its list of calls and the
    curriculum level a callback raises are the script's own (grpokit's worker processes would have seen neither)."""
    theirs = runs("side_effects", "trl")[0]["calls"]
    ours = runs("side_effects", "grpokit")[0]["calls"]
    assert ours == theirs == [(8, 0), (8, 1), (8, 2)]
