"""The Trainer surface TRL scripts use, end to end on a tiny model: evaluation as TRL does it (eval_strategy,
``evaluate()`` under TRL's names, eval entries in ``log_history``, a dict of eval datasets), TRL's metric names in
``log_history`` and callbacks, ``save_model``, ``train(resume_from_checkpoint=True)`` on a new trainer, a settable
``trainer.state``, ``push_to_hub`` offline, TRL's optimizer-step count with ``num_iterations`` and
``steps_per_generation``, and the generation options (``repetition_penalty``, ``generation_kwargs``) in training
and evaluation."""

from __future__ import annotations

import functools
import json
from types import SimpleNamespace

import pytest
import torch
from shared_helpers import TRL_STYLE, WORDS, tiny_args, word_prompts

from grpokit import GRPOConfig, GRPOTrainer

pytestmark = pytest.mark.usefixtures("one_thread")

PROMPTS = word_prompts(8, 3)


def has_target(prompts, completions, target, log_metric, **kwargs):
    log_metric("custom_accuracy", 0.75)
    return [float(t in c.split()) for c, t in zip(completions, target)]


config = functools.partial(tiny_args, **TRL_STYLE, num_generations_eval=2, pass_at_k=[1, 2])


class Recorder:
    """Duck-typed TrainerCallback keeping on_log's logs and on_evaluate's metrics."""

    def __init__(self):
        self.logs, self.evaluations = [], []

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.logs.append(dict(logs))

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        self.evaluations.append((state.global_step, dict(metrics)))


TRL_STEP_NAMES = {
    "completions/mean_length",
    "completions/min_length",
    "completions/max_length",
    "completions/clipped_ratio",
    "completions/mean_terminated_length",
    "completions/min_terminated_length",
    "completions/max_terminated_length",
    "reward",
    "reward_std",
    "frac_reward_zero_std",
    "rewards/has_target/mean",
    "rewards/has_target/std",
    "kl",
    "entropy",
    "clip_ratio/low_mean",
    "clip_ratio/high_mean",
    "clip_ratio/region_mean",
    "num_tokens",
    "grad_norm",
    "learning_rate",
    "loss",
    "epoch",
    "custom_accuracy",
}


def test_eval_strategy_steps_logs_trl_names_per_eval_dataset(tmp_path, tiny_model_dir):
    """eval_strategy="steps", eval_steps=1 and a dict of two eval datasets: each evaluation of each dataset is a
    log_history entry and an on_evaluate call under TRL's names (eval_<name>_reward ...); the step entries and
    on_log carry TRL's step names; metrics.jsonl and the store keep grpokit's."""
    from grpokit.store import RolloutStore

    recorder = Recorder()
    run = tmp_path / "run"
    trainer = GRPOTrainer(
        str(tiny_model_dir),
        has_target,
        args=config(run, eval_strategy="steps", eval_steps=1, beta=0.04),
        train_dataset=PROMPTS,
        eval_dataset={"first": PROMPTS[:2], "second": PROMPTS[2:5]},
        callbacks=[recorder],
    )
    assert set(trainer.eval_dataset) == {"first", "second"}
    trainer.train()
    history = trainer.state.log_history
    evals = [h for h in history if any(k.startswith("eval_") for k in h)]
    # before training, after step 1 and after step 2 (the last step is an eval step: no extra one at the end)
    assert [(h["step"], next(k for k in h if k.endswith("_reward")).split("_")[1]) for h in evals] == [
        (0, "first"),
        (0, "second"),
        (1, "first"),
        (1, "second"),
        (2, "first"),
        (2, "second"),
    ]
    second = evals[-1]
    for name in (
        "reward",
        "reward_std",
        "rewards/has_target/mean",
        "rewards/has_target/std",
        "frac_reward_zero_std",
        "completions/mean_length",
        "completions/clipped_ratio",
        "completions/mean_terminated_length",
        "custom_accuracy",
        "pass@1",
        "pass@2",
        "greedy_accuracy",
        "runtime",
        "samples_per_second",
    ):
        assert f"eval_second_{name}" in second, name
    assert second["eval_second_num_prompts"] == 3.0 and second["eval_second_custom_accuracy"] == 0.75
    assert 0.0 <= second["eval_second_pass@1"] <= second["eval_second_pass@2"] <= 1.0
    assert [(s, sorted(m)[0].split("_")[1]) for s, m in recorder.evaluations][::2] == [
        (0, "first"),
        (1, "first"),
        (2, "first"),
    ]
    steps = [h for h in history if "loss" in h]
    assert [h["step"] for h in steps] == [1, 2]
    assert TRL_STEP_NAMES <= set(steps[0]), TRL_STEP_NAMES - set(steps[0])
    assert "completion_length/mean" not in steps[0]  # the TRL name replaces grpokit's in the log
    assert steps[0]["num_tokens"] < steps[1]["num_tokens"]  # cumulative, prompt and completion tokens
    assert steps[0] == {**recorder.logs[2], "step": 1}  # on_log saw the same entry (after the two step-0 evals)
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert "completion_length/mean" in lines[-1] or "completion_length/mean" in lines[-3]
    assert any("eval/second/reward" in line for line in lines) and not any(
        "eval_second_reward" in line for line in lines
    )
    with RolloutStore(run, readonly=True) as store:
        assert {e["dataset"] for e in store.evals()} == {"first", "second"}
    # evaluate() after training: TRL's names for both datasets, epoch, and two more log entries
    logged = len(history)
    metrics = trainer.evaluate()
    assert {"eval_first_reward", "eval_second_reward", "eval_first_pass@1", "epoch"} <= set(metrics)
    assert len(trainer.state.log_history) == logged + 2
    one = trainer.evaluate("first")  # TRL: one dataset of the dict by name
    assert "eval_first_reward" in one and "eval_second_reward" not in one
    given = trainer.evaluate(eval_dataset=PROMPTS[:1], metric_key_prefix="test")
    assert given["test_num_prompts"] == 1.0 and "test_completions/mean_length" in given


def test_evaluate_returns_trl_names_for_one_eval_dataset(tmp_path, tiny_model_dir):
    trainer = GRPOTrainer(
        str(tiny_model_dir),
        has_target,
        args=config(tmp_path / "run", max_steps=1),
        train_dataset=PROMPTS,
        eval_dataset=PROMPTS[:2],
    )
    metrics = trainer.evaluate()
    assert metrics["eval_num_prompts"] == 2.0 and "eval_reward" in metrics and "eval_custom_accuracy" in metrics
    # TRL's eval loss of the samples (Learner.evaluation_loss; tests/unit/test_evaluation_loss.py), beta 0.04: a KL
    assert {"eval_loss", "eval_entropy", "eval_kl", "eval_clip_ratio/region_mean"} <= set(metrics)
    assert not any(k.startswith("eval/") for k in metrics)
    assert trainer.state.log_history[-1] == {**metrics, "step": 0}
    assert trainer.evaluation_metrics()["eval/num_prompts"] == 2.0  # grpokit's names, as metrics.jsonl has them


def test_save_model_writes_a_loadable_model_and_tokenizer(tmp_path, tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    trainer = GRPOTrainer(
        str(tiny_model_dir), has_target, args=config(tmp_path / "run", max_steps=1), train_dataset=PROMPTS
    )
    trainer.train()
    trainer.save_model(str(tmp_path / "saved"))
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "saved")
    for name, param in trainer.model.named_parameters():
        torch.testing.assert_close(loaded.get_parameter(name), param.detach(), rtol=0, atol=0)
    assert AutoTokenizer.from_pretrained(tmp_path / "saved").encode("w1 w2") == trainer.tokenizer.encode("w1 w2")
    trainer.save_model()  # TRL's default: args.output_dir
    assert (tmp_path / "run" / "config.json").is_file() and (tmp_path / "run" / "config.yaml").is_file()


def test_save_model_with_lora_writes_the_adapter(tmp_path, tiny_model_dir):
    from peft import AutoPeftModelForCausalLM, LoraConfig

    trainer = GRPOTrainer(
        str(tiny_model_dir),
        has_target,
        args=config(tmp_path / "run", max_steps=1),
        train_dataset=PROMPTS,
        peft_config=LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj"]),
    )
    trainer.train()
    trainer.save_model(str(tmp_path / "adapter"))
    assert (tmp_path / "adapter" / "adapter_config.json").is_file()
    loaded = AutoPeftModelForCausalLM.from_pretrained(tmp_path / "adapter")
    ours = {n: p for n, p in trainer.model.named_parameters() if "lora_" in n}
    theirs = dict(loaded.named_parameters())
    assert ours and all(torch.equal(theirs[n].detach(), p.detach()) for n, p in ours.items())


def test_resume_from_checkpoint_on_a_new_trainer(tmp_path, tiny_model_dir):
    """TRL's pattern: train, then a new trainer on the same output_dir with train(resume_from_checkpoint=True)
    continues from the last checkpoint, log_history included, to the weights of a run that never stopped (a
    constant learning rate: a linear schedule's length would follow max_steps, which differs)."""

    def args(run, **overrides):
        return config(run, lr_scheduler_type="constant", **overrides)

    straight = GRPOTrainer(
        str(tiny_model_dir), has_target, args=args(tmp_path / "straight", max_steps=3), train_dataset=PROMPTS
    )
    straight.train()
    run = tmp_path / "run"
    first = GRPOTrainer(
        str(tiny_model_dir), has_target, args=args(run, max_steps=2, save_steps=1), train_dataset=PROMPTS
    )
    first.train()
    again = GRPOTrainer(str(tiny_model_dir), has_target, args=args(run, max_steps=3), train_dataset=PROMPTS)
    from grpokit.config import ConfigError

    with pytest.raises(ConfigError, match=r"already holds a run; .*train\(resume_from_checkpoint=True\)"):
        again.train()  # without resuming, the run folder is not written over
    resumed = GRPOTrainer(str(tiny_model_dir), has_target, args=args(run, max_steps=3), train_dataset=PROMPTS)
    output = resumed.train(resume_from_checkpoint=True)
    assert output.global_step == 3 and resumed.state.global_step == 3
    assert [h["step"] for h in resumed.state.log_history if "loss" in h] == [1, 2, 3]  # steps 1-2 from the checkpoint
    assert resumed.state.num_input_tokens_seen == straight.state.num_input_tokens_seen
    for name, param in straight.model.named_parameters():
        torch.testing.assert_close(resumed.model.get_parameter(name), param, rtol=0, atol=0)


def test_state_can_be_set_and_built_parts_are_refused(tmp_path, tiny_model_dir):
    """A setter changes what the loop uses (``state``: the callbacks see it) or is refused: the loop holds the
    tokenizer and the model it was built with, so replacing them on a built trainer would change nothing."""
    trainer = GRPOTrainer(str(tiny_model_dir), has_target, args=config(tmp_path / "run"), train_dataset=PROMPTS)
    replaced = SimpleNamespace(global_step=2, num_input_tokens_seen=0)
    trainer.state = replaced
    assert trainer.state is replaced and trainer.callbacks.state is replaced
    for name in ("processing_class", "model", "tools"):
        with pytest.raises(AttributeError, match=f"trainer.{name} is fixed when the trainer is built"):
            setattr(trainer, name, None)
    with pytest.raises(AttributeError):  # a Run part without a setter
        trainer.learner = None
    assert trainer.processing_class is trainer.run.tokenizer and trainer.model is trainer.run.model
    bare = object.__new__(GRPOTrainer)  # as TRL's tests build one, then set what they use
    bare.state, bare.model, bare.processing_class = replaced, "model", "tokenizer"
    assert (bare.state, bare.model, bare.processing_class, bare.tokenizer) == (
        replaced,
        "model",
        "tokenizer",
        "tokenizer",
    )
    with pytest.raises(AttributeError, match="has no attribute 'tools'"):
        _ = bare.tools


def test_push_to_hub_offline_fails_in_one_line(tmp_path, tiny_model_dir, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    run = tmp_path / "run"
    trainer = GRPOTrainer(str(tiny_model_dir), has_target, args=config(run, max_steps=1), train_dataset=PROMPTS)
    with pytest.raises(ConnectionError) as raised:
        trainer.push_to_hub()
    message = str(raised.value)
    assert "\n" not in message and message.startswith("push_to_hub: could not upload to the Hub repo 'run'")
    assert "(HF_HUB_OFFLINE is set)" in message
    assert f"the model is saved in {run}" in message and (run / "model.safetensors").is_file()


def test_num_iterations_and_steps_per_generation_count_optimizer_steps_as_trl(tmp_path, tiny_model_dir):
    """num_iterations=2, steps_per_generation=2, max_steps=4: TRL samples one generation batch of 2 x 8 = 16
    completions and takes 4 optimizer steps on it (2 mini-batches, 2 passes); so does grpokit."""
    from grpokit.store import RolloutStore

    run = tmp_path / "run"
    args = config(run, num_iterations=2, steps_per_generation=2, max_steps=4, beta=0.0)
    trainer = GRPOTrainer(str(tiny_model_dir), has_target, args=args, train_dataset=PROMPTS)
    assert trainer.args.max_steps == 1  # one generation batch
    trainer.train()
    optimizer_steps = trainer.scheduler.last_epoch  # the schedule steps once per optimizer step
    with RolloutStore(run, readonly=True) as store:
        sampled = sum(row["n"] for row in store.summary())
    assert (optimizer_steps, sampled) == (4, 16)


def test_num_iterations_alone_counts_optimizer_steps_and_completions_as_trl(tmp_path, tiny_model_dir):
    """A TRL script with num_iterations=2, max_steps=2 and steps_per_generation unset. TRL's numbers (grpo_config.py:
    steps_per_generation defaults to gradient_accumulation_steps = 1, so generation_batch_size = 8 x 1 process x 1 = 8;
    grpo_trainer.py `_prepare_inputs`: it generates every steps_per_generation x num_iterations = 2 micro-batches and
    steps the optimizer every gradient_accumulation_steps = 1): max_steps=2 optimizer steps are 2 micro-batches, one
    generation of 8 completions (2 prompts x 4), each used twice. grpokit: one generation batch of 8, 2 passes.
    The same settings run through TRL itself below give the same counts."""
    from grpokit.store import RolloutStore

    run = tmp_path / "run"
    settings = dict(num_iterations=2, max_steps=2, per_device_train_batch_size=8, num_generations=4, save_steps=2)
    trainer = GRPOTrainer(str(tiny_model_dir), has_target, args=config(run, **settings), train_dataset=PROMPTS)
    assert (trainer.args.max_steps, trainer.args.save_steps) == (1, 1)  # one generation batch
    trainer.train()
    with RolloutStore(run, readonly=True) as store:
        sampled = sum(row["n"] for row in store.summary())
    ours = (trainer.scheduler.last_epoch, sampled)  # the schedule steps once per optimizer step
    assert ours == (2, 8)

    pytest.importorskip("trl")
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import GRPOConfig as TRLConfig
    from trl import GRPOTrainer as TRLTrainer

    scored = []

    def counting(completions, **kwargs):
        scored.append(len(completions))
        return [0.0] * len(completions)

    trl_args = TRLConfig(
        output_dir=str(tmp_path / "trl"),
        use_cpu=True,
        bf16=False,
        max_completion_length=4,
        learning_rate=1e-3,
        report_to="none",
        disable_tqdm=True,
        save_strategy="no",
        logging_steps=1,
        **{k: v for k, v in settings.items() if k != "save_steps"},
    )
    theirs = TRLTrainer(
        model=str(tiny_model_dir),
        reward_funcs=counting,
        args=trl_args,
        train_dataset=Dataset.from_list(PROMPTS),
        processing_class=AutoTokenizer.from_pretrained(tiny_model_dir),
    )
    theirs.train()
    assert (theirs.state.global_step, sum(scored)) == ours == (2, 8)


def test_resuming_a_trl_num_iterations_run_does_not_convert_twice(tmp_path, tiny_model_dir):
    """TRL's form converts once, when the script builds its config: num_iterations=2, max_steps=2 optimizer steps is
    one generation batch, and the run folder's config.yaml says max_steps 1. Read back (the command line's resume,
    grpokit eval / explain) it stays 1; a script run again with TRL's numbers and told to resume gets the same count;
    extending the run from its saved config counts generation batches."""
    from grpokit.config import load_config
    from grpokit.store import RolloutStore

    run = tmp_path / "run"

    def trl_form(**overrides):
        return config(run, num_iterations=2, save_steps=2, lr_scheduler_type="constant", **overrides)

    GRPOTrainer(str(tiny_model_dir), has_target, args=trl_form(max_steps=4), train_dataset=PROMPTS).train()
    saved = load_config(run / "config.yaml")
    assert (saved.max_steps, saved.save_steps, saved.num_iterations) == (2, 1, 2)  # not halved again

    again = GRPOTrainer(str(tiny_model_dir), has_target, args=trl_form(max_steps=6), train_dataset=PROMPTS)
    assert again.args.max_steps == 3
    again.train(resume_from_checkpoint=True)
    assert (again.step, again.scheduler.last_epoch) == (3, 6)  # 3 generation batches, TRL's 6 optimizer steps

    extended = load_config(run / "config.yaml", ["resume_from=latest", "max_steps=4"])  # grpokit's form
    assert extended.max_steps == 4
    longer = GRPOTrainer(str(tiny_model_dir), has_target, args=extended, train_dataset=PROMPTS)
    longer.train()
    assert (longer.step, longer.scheduler.last_epoch) == (4, 8)
    with RolloutStore(run, readonly=True) as store:
        assert sum(row["n"] for row in store.summary()) == 4 * 8


def completion_ids_of(path):
    return [ids for line in path.read_text().splitlines() for ids in json.loads(line)]


def test_generation_kwargs_act_in_training_and_evaluation(tmp_path, tiny_model_dir):
    """suppress_tokens: no completion of training or evaluation (sampled or greedy) holds them; the untrained
    policy writes them otherwise. A reward records every completion it scores."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    log = tmp_path / "ids.jsonl"

    def recorder(completions, completion_ids, **kwargs):
        with open(log, "a") as f:
            f.write(json.dumps(completion_ids) + "\n")
        return [0.0] * len(completions)

    def run(name, **options):
        log.unlink(missing_ok=True)
        trainer = GRPOTrainer(
            str(tiny_model_dir),
            [has_target, recorder],
            args=config(tmp_path / name, max_steps=2, max_completion_length=6, temperature=2.0, **options),
            train_dataset=PROMPTS,
            eval_dataset=PROMPTS[:4],
        )
        trainer.train()
        trainer.evaluate()
        return completion_ids_of(log)

    words = [tokenizer.convert_tokens_to_ids(w) for w in WORDS[:20]]
    plain = run("plain")
    assert any(t in words for ids in plain for t in ids)  # the policy writes these words when free to
    suppressed = run("suppressed", generation_kwargs={"suppress_tokens": words})
    assert len(suppressed) == len(plain) and not any(t in words for ids in suppressed for t in ids)


def test_repetition_penalty_stops_greedy_repeats(tmp_path, tiny_model_dir):
    """Greedy (do_sample=False) completions of this untrained policy repeat a token; with repetition_penalty=10
    none does (each token's logit is divided by 10 once it is in the context)."""
    log = tmp_path / "ids.jsonl"

    def recorder(completions, completion_ids, **kwargs):
        with open(log, "a") as f:
            f.write(json.dumps(completion_ids) + "\n")
        return [float(len(set(ids))) for ids in completion_ids]

    def completions(name, **options):
        log.unlink(missing_ok=True)
        args = config(tmp_path / name, max_steps=1, max_completion_length=6, generation_kwargs={"do_sample": False})
        trainer = GRPOTrainer(str(tiny_model_dir), recorder, args=args.replace(**options), train_dataset=PROMPTS)
        trainer.train()
        return completion_ids_of(log)

    def repeats(ids):
        return len(ids) > len(set(ids))

    assert all(repeats(ids) for ids in completions("plain"))
    assert not any(repeats(ids) for ids in completions("penalised", repetition_penalty=10.0))


def test_chat_template_kwargs_reach_the_prompts(tmp_path, tiny_model_dir):
    """TRL's chat_template_kwargs are apply_chat_template's keywords for every prompt (e.g. enable_thinking)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    tokenizer.chat_template = (
        "{% for m in messages %}{{ m['role'] }} : {{ m['content'] }} {% endfor %}"
        "{% if add_generation_prompt %}assistant :{% if terse %} w0{% endif %}{% endif %}"
    )
    rows = [{"prompt": [{"role": "user", "content": "w1 w2"}], "target": "w3"}] * 2

    def texts(**options):
        args = config(tmp_path / "run", per_device_train_batch_size=4, num_generations=2, **options)
        trainer = GRPOTrainer(
            str(tiny_model_dir), has_target, args=args, train_dataset=rows, processing_class=tokenizer
        )
        return trainer.train_source.texts

    assert texts() == ["user : w1 w2 assistant :"] * 2
    assert texts(chat_template_kwargs={"terse": True}) == ["user : w1 w2 assistant : w0"] * 2


def test_disable_dropout_zeroes_the_policy_dropout():
    from grpokit.compose.policy import build_policy

    class Tokenizer:
        eos_token_id = pad_token_id = 0

    model = torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.Dropout(0.3), torch.nn.Linear(4, 10))
    kept, *_ = build_policy(model, Tokenizer(), GRPOConfig(device="cpu"))
    assert kept[1].p == 0.3
    model = torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.Dropout(0.3), torch.nn.Linear(4, 10))
    policy, *_ = build_policy(model, Tokenizer(), GRPOConfig(device="cpu", disable_dropout=True))
    assert policy[1].p == 0.0


def test_log_entries_average_the_steps_since_the_last_as_trl(tmp_path, tiny_model_dir):
    """logging_steps=2, max_steps=3: the entry at step 2 holds the mean of steps 1 and 2 (metrics.jsonl has each
    step), the closing entry and train()'s metrics the unlogged step 3's, as TRL's closing log carries them; the
    learning rate is the last step's."""
    run = tmp_path / "run"
    trainer = GRPOTrainer(
        str(tiny_model_dir), has_target, args=config(run, max_steps=3, logging_steps=2), train_dataset=PROMPTS
    )
    output = trainer.train()
    steps = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    entry, closing = trainer.state.log_history
    assert entry["step"] == 2 and closing["step"] == 3 and "train_loss" in closing
    assert entry["loss"] == pytest.approx((steps[0]["loss"] + steps[1]["loss"]) / 2)
    assert entry["completions/mean_length"] == pytest.approx(
        (steps[0]["completion_length/mean"] + steps[1]["completion_length/mean"]) / 2
    )
    assert entry["learning_rate"] == steps[1]["learning_rate"] and entry["num_tokens"] == steps[1]["num_tokens"]
    assert closing["reward"] == pytest.approx(steps[2]["reward"]) and output.metrics["reward"] == closing["reward"]
    assert trainer.ref_model is not None and trainer.ref_model is not trainer.model  # beta 0.04: a frozen copy


def test_beam_search_generation_kwargs_train_with_transformers_generate(tmp_path, tiny_model_dir):
    """TRL passes generation_kwargs to transformers' GenerationConfig: beam sampling (num_beams=2, length_penalty)
    trains, sampled by transformers' generate, and the weights move."""
    from grpokit.rollout.transformers_engine import TransformersRolloutEngine

    args = config(
        tmp_path / "run", generation_kwargs={"do_sample": True, "top_k": 50, "num_beams": 2, "length_penalty": -0.1}
    )
    trainer = GRPOTrainer(str(tiny_model_dir), has_target, args=args, train_dataset=PROMPTS)
    assert isinstance(trainer.engine, TransformersRolloutEngine)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    assert trainer.state.log_history[-1]["train_loss"] is not None
    assert any(not torch.equal(p, trainer.model.get_parameter(n)) for n, p in before.items())


def test_streaming_dataset_rules_and_data_loaders(tmp_path, tiny_model_dir):
    """A streaming train set: dispatch_batches=True is refused, dataloader_num_workers becomes 0 and
    accelerator_config.dispatch_batches False (as TRL). A map-style train set keeps its workers while a streaming
    eval set's loader reads with one; the loaders yield the rows in batches of the per-device batch sizes."""
    datasets = pytest.importorskip("datasets")
    stream = datasets.Dataset.from_list(PROMPTS).to_iterable_dataset()
    with pytest.raises(ValueError, match=r"Iterable datasets require `dispatch_batches=False`"):
        GRPOTrainer(
            str(tiny_model_dir),
            has_target,
            args=config(tmp_path / "a", accelerator_config={"dispatch_batches": True}),
            train_dataset=stream,
        )
    trainer = GRPOTrainer(
        str(tiny_model_dir),
        has_target,
        args=config(tmp_path / "b", dataloader_num_workers=2),
        train_dataset=stream,
    )
    assert trainer.args.dataloader_num_workers == 0 and trainer.args.accelerator_config.dispatch_batches is False
    trainer = GRPOTrainer(
        str(tiny_model_dir),
        has_target,
        args=config(tmp_path / "c", dataloader_num_workers=2, per_device_eval_batch_size=3),
        train_dataset=PROMPTS,
        eval_dataset=datasets.Dataset.from_list(PROMPTS[:4]).to_iterable_dataset(),
    )
    train_loader, eval_loader = trainer.get_train_dataloader(), trainer.get_eval_dataloader()
    assert train_loader.num_workers == 2 and eval_loader.num_workers == 0 and trainer.args.dataloader_num_workers == 2
    assert [len(b) for b in eval_loader] == [3, 1] and next(iter(eval_loader))[0]["prompt"] == PROMPTS[0]["prompt"]
    assert sum(len(b) for b in train_loader) == len(PROMPTS)
