"""TRL's ``GRPOTrainer(rollout_func=...)`` end to end on a tiny model: the function's calls and prompts, its extra
keys reaching a reward function, env_mask as the loss mask, evaluation through it, and its errors (a missing key,
the wrong number of completions, the settings it cannot run with)."""

from __future__ import annotations

import functools

import pytest
import torch
from shared_helpers import TRL_STYLE, tiny_args, word_prompts

from grpokit import GRPOTrainer
from grpokit.config import ConfigError

pytestmark = pytest.mark.usefixtures("one_thread")

PROMPTS = word_prompts(8, 3)
G = 4


config = functools.partial(tiny_args, **TRL_STYLE, num_generations=G, max_completion_length=6)  # 2 prompts a step


class Environment:
    """A rollout_func in TRL's form: each completion is a model token, a token the environment inserted (env_mask 0),
    another model token and EOS; ``env_score`` (an extra key) scores it."""

    def __init__(self):
        self.calls = []

    def __call__(self, prompts, trainer):
        self.calls.append((list(prompts), trainer))
        tok = trainer.processing_class
        ids = tok.convert_tokens_to_ids
        out = {"prompt_ids": [], "completion_ids": [], "logprobs": [], "env_mask": [], "env_score": []}
        for i, prompt in enumerate(prompts):
            first = "w7" if i % 2 == 0 else "w8"
            out["prompt_ids"].append(tok(prompt)["input_ids"])
            out["completion_ids"].append([ids(first), ids("w1"), ids("w9"), tok.eos_token_id])
            out["logprobs"].append([-1.0, 0.0, -1.0, -0.5])
            out["env_mask"].append([1, 0, 1, 1])
            out["env_score"].append(1.0 if first == "w7" else 0.0)
        return out


def test_rollout_func_trains_with_its_completions_columns_and_mask(tmp_path, tiny_model_dir):
    env = Environment()
    seen = []

    def from_environment(completions, env_score, target, **kwargs):
        seen.append((list(completions), list(env_score), list(target)))
        return list(env_score)

    trainer = GRPOTrainer(
        str(tiny_model_dir),
        from_environment,
        args=config(tmp_path / "run"),
        train_dataset=PROMPTS,
        rollout_func=env,
    )
    masks = []
    update = trainer.learner.update

    def recording_update(batch, advantages, loss_mask, *args, **kwargs):
        masks.append(loss_mask.clone())
        return update(batch, advantages, loss_mask, *args, **kwargs)

    trainer.learner.update = recording_update
    trainer.train()

    # called once a step with the step's prompts as the dataset holds them, each G times in a row, and the trainer
    assert len(env.calls) == 2
    dataset_prompts = {row["prompt"] for row in PROMPTS}
    for prompts, given in env.calls:
        assert given is trainer and len(prompts) == 2 * G and set(prompts) <= dataset_prompts
        assert prompts == [p for p in prompts[::G] for _ in range(G)] and prompts[0] != prompts[G]
    # the extra key reached the reward function, one value per completion, with the dataset's columns
    assert [score for _, score, _ in seen] == [[1.0, 0.0] * G] * 2
    assert seen[0][1] and seen[0][2] == ["w7"] * (2 * G)
    assert seen[0][0][0] == "w7 w1 w9"  # decoded from the function's completion ids (EOS skipped)
    # env_mask is the loss mask: the token the environment inserted gets no loss
    assert len(masks) == 2
    for mask in masks:
        assert mask.shape == (2 * G, 4)
        assert mask[:, 1].eq(0).all() and mask[:, [0, 2, 3]].eq(1).all()
    log = [entry for entry in trainer.state.log_history if "reward" in entry]
    assert [entry["reward"] for entry in log] == [0.5, 0.5]
    assert log[0]["completions/mean_length"] == 3.0  # the model's tokens only, as TRL counts them
    assert log[0]["completions/clipped_ratio"] == 0.0  # every completion ends with EOS


def test_rollout_func_evaluates_with_num_generations_eval(tmp_path, tiny_model_dir):
    env = Environment()
    trainer = GRPOTrainer(
        str(tiny_model_dir),
        lambda env_score, **kwargs: env_score,
        args=config(tmp_path / "run", num_generations_eval=2, pass_at_k=[1, 2], max_steps=1),
        train_dataset=PROMPTS,
        eval_dataset=PROMPTS[:2],
        rollout_func=env,
    )
    metrics = trainer.evaluate()
    (prompts, _), *rest = env.calls
    assert not rest and prompts == [PROMPTS[0]["prompt"]] * 2 + [PROMPTS[1]["prompt"]] * 2  # no greedy pass
    assert metrics["eval_reward"] == 0.5 and metrics["eval_pass@2"] == 1.0
    assert "eval_greedy_accuracy" not in metrics


def test_rollout_func_errors_name_the_fix(tmp_path, tiny_model_dir):
    def missing_logprobs(prompts, trainer):
        out = Environment()(prompts, trainer)
        del out["logprobs"]
        return out

    trainer = GRPOTrainer(
        str(tiny_model_dir), lambda completions, **kw: [0.0] * len(completions), args=config(tmp_path / "a"),
        train_dataset=PROMPTS, rollout_func=missing_logprobs,
    )  # fmt: skip
    with pytest.raises(ValueError, match=r"rollout_func must return keys \['logprobs'\] in its output dict\."):
        trainer.train()

    def once_per_prompt(prompts, trainer):  # a function that expected each prompt once
        return Environment()(prompts[::G], trainer)

    trainer = GRPOTrainer(
        str(tiny_model_dir), lambda completions, **kw: [0.0] * len(completions), args=config(tmp_path / "b"),
        train_dataset=PROMPTS, rollout_func=once_per_prompt,
    )  # fmt: skip
    with pytest.raises(ValueError, match=r"prompt_ids 2, completion_ids 2, .* for 8 prompts.*num_generations times"):
        trainer.train()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"tools": [lambda x: x]}, "and so do tools / environment_factory; pass one of them"),
        ({"args_overrides": {"use_vllm": True}}, "generation.engine: vllm .*remove that setting"),
        ({"args_overrides": {"backend": "ray"}}, "distributed.backend: ray"),
        ({"rollout_func": "not a function"}, "rollout_func is a str; pass a function"),
    ],
)
def test_rollout_func_refuses_what_it_cannot_run_with(tmp_path, kwargs, message):
    overrides = kwargs.pop("args_overrides", {})
    kwargs.setdefault("rollout_func", Environment())
    with pytest.raises(ConfigError, match=message):
        GRPOTrainer(
            "no-model-is-loaded",
            lambda completions, **kw: [0.0] * len(completions),
            args=config(tmp_path / "run", **overrides),
            train_dataset=PROMPTS,
            **kwargs,
        )


def test_generate_calls_the_function_with_the_trainer(tmp_path, tiny_model_dir):
    env = Environment()
    trainer = GRPOTrainer(
        str(tiny_model_dir), lambda env_score, **kw: env_score, args=config(tmp_path / "run"), train_dataset=PROMPTS,
        rollout_func=env,
    )  # fmt: skip
    prompts = ["w1 w2 w3", "w1 w2 w3"]
    out = trainer._generate(prompts)
    assert env.calls == [(prompts, trainer)] and env.calls[0][0] is not prompts  # a copy, as TRL passes
    assert out.env_mask == [[1, 0, 1, 1]] * 2 and out.extra == {"env_score": [1.0, 0.0]}
    assert out.prompt_ids[0] == trainer.processing_class("w1 w2 w3")["input_ids"]
    assert torch.tensor(out.logprobs).shape == (2, 4)
