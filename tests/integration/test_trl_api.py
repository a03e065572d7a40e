"""GRPOTrainer's TRL-style arguments and run controls, end to end on a tiny model: callbacks with a
TrainerState, ``should_training_stop``, ``peft_config``, ``optimizers``, ``num_train_epochs`` with
``max_steps=-1``, the save and eval strategies, and the console progress from Python."""

from __future__ import annotations

import functools
import json

import pytest
import torch
from shared_helpers import TRL_STYLE, tiny_args, word_prompts

from grpokit import GRPOTrainer

pytestmark = pytest.mark.usefixtures("one_thread")

PROMPTS = word_prompts(8, 3)


def has_target(prompts, completions, target, **kwargs):
    return [float(t in c.split()) for c, t in zip(completions, target)]


config = functools.partial(tiny_args, **TRL_STYLE)


class Recorder:
    """A TrainerCallback-shaped recorder (duck typed: transformers calls methods by name)."""

    def __init__(self, stop_at=None):
        self.events, self.logs, self.stop_at = [], [], stop_at

    def __getattr__(self, name):
        if not name.startswith("on_"):
            raise AttributeError(name)

        def event(args, state, control, **kwargs):
            self.events.append((name, state.global_step))
            if name == "on_log":
                self.logs.append(kwargs["logs"])
            if name == "on_step_end" and self.stop_at is not None and state.global_step >= self.stop_at:
                control.should_training_stop = True
            return control

        return event


def test_callbacks_see_every_event_and_can_stop_the_run(tmp_path, tiny_model_dir):
    from transformers import TrainerCallback, TrainerState

    recorder = Recorder(stop_at=2)

    class SaveAtOne(TrainerCallback):  # a real TrainerCallback asking for a checkpoint grpokit would not write
        def on_step_end(self, args, state, control, **kwargs):
            control.should_save = state.global_step == 1

    run = tmp_path / "run"
    trainer = GRPOTrainer(
        str(tiny_model_dir),
        has_target,
        args=config(run, max_steps=5, save_steps=0),
        train_dataset=PROMPTS,
        processing_class=None,
        callbacks=[recorder, SaveAtOne],
    )
    assert isinstance(trainer.state, TrainerState) and trainer.state.max_steps == 5
    trainer.train()
    names = [name for name, _ in recorder.events]
    assert names[:3] == ["on_init_end", "on_train_begin", "on_epoch_begin"]
    assert names[-2:] == [
        "on_log",
        "on_train_end",
    ]  # the closing log (train_runtime ...) then the end, as in transformers
    assert [s for name, s in recorder.events if name == "on_step_begin"] == [0, 1]  # global_step counts steps done
    assert [s for name, s in recorder.events if name == "on_step_end"] == [1, 2]
    assert [s for name, s in recorder.events if name == "on_save"] == [
        1,
        2,
    ]  # asked for at 1; the final checkpoint at 2
    assert trainer.state.global_step == 2 and trainer.stop_reason == "a callback set control.should_training_stop"
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-1", "step-2"]
    assert (run / "final").is_dir()
    history = trainer.state.log_history
    assert [h["step"] for h in history] == [1, 2, 2] and "reward" in history[0] and "train_runtime" in history[-1]
    assert history[0]["epoch"] == 0.25  # 8 prompts, 2 per step: 4 steps per epoch
    assert recorder.logs[0]["reward"] == history[0]["reward"]


def test_logging_steps_sets_on_log_and_console_lines(tmp_path, tiny_model_dir, capsys):
    recorder = Recorder()
    args = config(tmp_path / "run", max_steps=4, logging_steps=2, disable_tqdm=False)
    trainer = GRPOTrainer(str(tiny_model_dir), has_target, args=args, train_dataset=PROMPTS, callbacks=[recorder])
    trainer.train()
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("step ")]
    assert [line.split(":")[0] for line in lines] == ["step 2", "step 4"]
    assert all("reward=" in line and "kl=" in line and "step_time=" in line for line in lines)
    assert "done: 4 steps in" in err
    assert [s for name, s in recorder.events if name == "on_log"] == [2, 4, 4]
    metrics = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2, 3, 4]  # metrics.jsonl keeps every step


def test_quiet_run_prints_no_progress(tmp_path, tiny_model_dir, capsys):
    GRPOTrainer(
        str(tiny_model_dir),
        has_target,
        args=config(tmp_path / "run", max_steps=1, report_to=["jsonl"]),
        train_dataset=PROMPTS,
    ).train()
    assert "step 1" not in capsys.readouterr().err


def test_num_train_epochs_with_max_steps_minus_one_and_epoch_strategies(tmp_path, tiny_model_dir):
    # 8 prompts, 2 prompts per step -> 4 steps per epoch; 1.5 epochs -> ceil(6) steps; a checkpoint after each epoch
    recorder = Recorder()
    run = tmp_path / "run"
    args = config(
        run,
        max_steps=-1,
        num_train_epochs=1.5,
        save_strategy="epoch",
        eval_strategy="epoch",
        eval_steps=None,
        num_generations_eval=2,
        pass_at_k=[1],
        max_eval_prompts=2,
    )
    trainer = GRPOTrainer(
        str(tiny_model_dir),
        has_target,
        args=args,
        train_dataset=PROMPTS,
        eval_dataset=PROMPTS[:2],
        callbacks=[recorder],
    )
    assert trainer.args.max_steps == 6 and trainer.state.max_steps == 6 and args.max_steps == -1
    trainer.train()
    assert trainer.state.global_step == 6 and trainer.state.epoch == 1.5
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-4", "step-6"]  # epoch end, run end
    assert [s for name, s in recorder.events if name == "on_evaluate"] == [0, 4, 6]  # before, epoch end, after
    assert [s for name, s in recorder.events if name == "on_epoch_end"] == [4, 6]  # the second, partial epoch ends too


def test_save_strategy_no_writes_no_checkpoint(tmp_path, tiny_model_dir):
    run = tmp_path / "run"
    GRPOTrainer(
        str(tiny_model_dir), has_target, args=config(run, save_strategy="no", save_steps=1), train_dataset=PROMPTS
    ).train()
    assert not (run / "checkpoints").exists() or not any((run / "checkpoints").iterdir())
    assert (run / "final").is_dir()


def test_peft_config_trains_lora_adapters(tmp_path, tiny_model_dir):
    from peft import LoraConfig

    peft_config = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules={"q_proj", "v_proj"})
    trainer = GRPOTrainer(
        str(tiny_model_dir),
        has_target,
        args=config(tmp_path / "run", max_steps=1),
        train_dataset=PROMPTS,
        peft_config=peft_config,
    )
    assert (trainer.args.lora.r, trainer.args.lora.alpha, trainer.args.lora.target_modules) == (
        4,
        8,
        ["q_proj", "v_proj"],
    )
    trained = [n for n, p in trainer.model.named_parameters() if p.requires_grad]
    assert trained and all("lora_" in n for n in trained)
    assert all(("q_proj" in n or "v_proj" in n) for n in trained)
    assert trainer.reference is not None and trainer.reference.model is None  # the base under the adapters, no copy
    trainer.train()
    assert (tmp_path / "run" / "final" / "adapter_config.json").exists()


def test_peft_config_must_be_lora(tmp_path, tiny_model_dir):
    from grpokit.config import ConfigError

    with pytest.raises(ConfigError, match=r"pass a peft\.LoraConfig"):
        GRPOTrainer(
            str(tiny_model_dir), has_target, args=config(tmp_path / "run"), train_dataset=PROMPTS, peft_config={"r": 4}
        )


def test_optimizers_are_used(tmp_path, tiny_model_dir):
    from grpokit.models.loading import load_model

    model = load_model(str(tiny_model_dir), torch.float32, torch.device("cpu"))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 0.5**step)
    trainer = GRPOTrainer(
        model,
        has_target,
        args=config(tmp_path / "run"),
        train_dataset=PROMPTS,
        processing_class=str(tiny_model_dir),
        optimizers=(optimizer, scheduler),
    )
    assert trainer.optimizer is optimizer and trainer.scheduler is scheduler
    before = [p.detach().clone() for p in model.parameters()]
    trainer.train()
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.125)  # 0.5 x 0.5^2: the scheduler stepped twice
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_tokenizer_and_processing_class_are_one_argument(tmp_path, tiny_model_dir):
    from grpokit.config import ConfigError
    from grpokit.models.loading import load_tokenizer

    a, b = load_tokenizer(str(tiny_model_dir)), load_tokenizer(str(tiny_model_dir))
    with pytest.raises(ConfigError, match="same argument"):
        GRPOTrainer(
            str(tiny_model_dir),
            has_target,
            args=config(tmp_path / "run"),
            train_dataset=PROMPTS,
            processing_class=a,
            tokenizer=b,
        )
    trainer = GRPOTrainer(
        str(tiny_model_dir), has_target, args=config(tmp_path / "run"), train_dataset=PROMPTS, tokenizer=a
    )
    assert trainer.processing_class is a


def test_log_completions_prints_a_table(tmp_path, tiny_model_dir, capsys):
    GRPOTrainer(
        str(tiny_model_dir),
        has_target,
        args=config(tmp_path / "run", max_steps=1, log_completions=True, num_completions_to_print=2),
        train_dataset=PROMPTS,
    ).train()
    err = capsys.readouterr().err
    assert "completions at step 1" in err and "advantage" in err


def test_cli_takes_trl_keys(tmp_path, tiny_model_dir):
    import yaml
    from shared_helpers import TARGET_REWARD

    from grpokit.cli import main

    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in PROMPTS))
    config = tmp_path / "config.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "model_name_or_path": str(tiny_model_dir),
                "train_dataset": str(data),
                "num_generations": 4,
                "per_device_train_batch_size": 8,
                "max_completion_length": 4,
                "rewards": [TARGET_REWARD],
                "output_dir": str(tmp_path / "run"),
            }
        )
    )
    assert (
        main(
            [
                "train",
                str(config),
                "max_steps=-1",
                "num_train_epochs=0.5",
                "bf16=false",
                "report_to=none",
                "save_strategy=no",
                "--disable_tqdm",
            ]
        )
        == 0
    )
    saved = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert (
        saved["model"]["mixed_precision"] == "no"  # bf16=false: no autocast, float32 weights (dtype: auto)
        and saved["run"]["save_strategy"] == "no"
        and saved["optim"]["max_steps"] == 2
    )
    assert [json.loads(x)["step"] for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()] == [1, 2]


def test_reward_processing_classes_reach_a_sequence_classifier(tmp_path, tiny_model_dir):
    # An nn.Module reward scored as TRL scores it: logits[:, 0] of prompt + completion, tokenized by its processing
    # class.
    from grpokit.config import ConfigError
    from grpokit.models.loading import load_tokenizer
    from grpokit.store import RolloutStore
    from grpokit.testing import build_tiny_reward_model

    tokenizer = load_tokenizer(str(tiny_model_dir))
    judge, _ = build_tiny_reward_model(None, tokenizer)  # one layer, hidden 32, num_labels 1, seed 0
    with pytest.raises(ConfigError, match="reward_processing_classes"):
        GRPOTrainer(str(tiny_model_dir), judge, args=config(tmp_path / "none", max_steps=1), train_dataset=PROMPTS)
    run = tmp_path / "run"
    GRPOTrainer(
        str(tiny_model_dir),
        judge,
        args=config(run, max_steps=1),
        train_dataset=PROMPTS,
        reward_processing_classes=[tokenizer],
    ).train()
    with RolloutStore(run, readonly=True) as store:
        rows = store.rollouts(step=1)
    texts = [row["prompt"] + row["completion"] for row in rows]
    inputs = tokenizer(text=texts, return_tensors="pt", padding=True, padding_side="right", add_special_tokens=False)
    with torch.no_grad():
        expected = judge(**inputs).logits[:, 0]
    got = torch.tensor([next(iter(row["rewards"].values())) for row in rows])
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)


def test_a_loaded_model_without_a_tokenizer_gets_the_one_it_was_loaded_with(tmp_path, tiny_model_dir):
    """TRL's GRPOTrainer(model=<loaded HF model>) with no processing_class loads the tokenizer from the folder the
    model came from (model.config._name_or_path); a module with no such folder still asks for one."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir))
    trainer = GRPOTrainer(model=model, reward_funcs=has_target, args=config(tmp_path / "run"), train_dataset=PROMPTS)
    assert trainer.processing_class.name_or_path == str(tiny_model_dir)
    assert trainer.processing_class.get_vocab() == AutoTokenizer.from_pretrained(str(tiny_model_dir)).get_vocab()
    model.config._name_or_path = ""  # built from a config: no folder to look in
    with pytest.raises(ValueError, match="no tokenizer"):
        GRPOTrainer(model=model, reward_funcs=has_target, args=config(tmp_path / "run2"), train_dataset=PROMPTS)
