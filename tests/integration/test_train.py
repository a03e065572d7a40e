"""End to end through the CLI and the Python API on a tiny random model (no downloads)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from shared_helpers import TARGET_REWARD, tiny_args, tiny_run_config, word_prompts

from grpokit import GRPOTrainer
from grpokit.cli import main
from grpokit.store import RolloutStore

# this module's run, besides tiny_run_config's: 4 steps of completions of 6 tokens, 2 micro-batches a step
OWN = {
    "generation": {"max_completion_length": 6},
    "optim": {"learning_rate": 5e-3, "gradient_accumulation_steps": 2, "lr_scheduler_type": "constant"},
}


def write_config(tmp_path: Path, model_dir: Path, prompts: list[dict], **sections) -> Path:
    merged = {name: OWN.get(name, {}) | sections.get(name, {}) for name in OWN.keys() | sections.keys()}
    return tiny_run_config(tmp_path, model_dir, max_steps=4, prompts=prompts, **merged)


def read_metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_cli_learns_a_learnable_reward(tmp_path, tiny_model_dir, word_prompts):
    config = write_config(tmp_path, tiny_model_dir, word_prompts)
    assert main(["train", str(config), "max_steps=60", "--save_steps=30"]) == 0
    rewards = [m["reward"] for m in read_metrics(tmp_path / "run") if "reward" in m]
    assert len(rewards) == 60
    first, last = sum(rewards[:10]) / 10, sum(rewards[-10:]) / 10
    # a random 40-word policy puts the target word in ~1/45 of positions; learning must lift it well above
    assert last > first + 0.2, (first, last)
    run = tmp_path / "run"
    assert (run / "final" / "model.safetensors").exists() and (run / "report.html").exists()
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-30", "step-60"]
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(run / "final")  # the final model loads with transformers


def test_python_api_trains_and_evaluates(tmp_path, tiny_model_dir, word_prompts):
    args = tiny_args(
        tmp_path / "run",
        max_completion_length=5,
        logging_steps=1,  # an entry per step (TRL's default is 10)
        eval_steps=2,
        num_generations_eval=4,
        pass_at_k=[1, 4],
        success_threshold=0.2,
    )
    trainer = GRPOTrainer(
        str(tiny_model_dir), TARGET_REWARD, args=args, train_dataset=word_prompts, eval_dataset=word_prompts[:4]
    )
    output = trainer.train()
    metrics = next(h for h in reversed(trainer.state.log_history) if "loss" in h and "step" in h)  # the last step's
    for key in (
        "loss",
        "policy_loss",
        "kl",
        "kl_penalty",
        "reward",
        "reward_std",
        "advantage/mean",
        "frac_reward_zero_std",
        "completions/mean_length",  # TRL's names in log_history (metrics.jsonl: completion_length/mean ...)
        "completions/clipped_ratio",
        "clip_ratio/region_mean",
        "entropy",
        "learning_rate",
        "grad_norm",
        "time/generate",
        "time/reward",
        "time/logprobs",
        "time/update",
        "tokens_per_second",
    ):
        assert key in metrics, key
    evals = trainer.evaluate()  # TRL's names: eval_<name>
    assert 0.0 <= evals["eval_pass@1"] <= evals["eval_pass@4"] <= 1.0
    stored = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in stored if "eval/pass@1" in m] == [0, 2]  # before training and at eval_steps
    # each held-out prompt's result is kept (the report's held-out view): pass@1 is the mean of correct / samples and
    # pass@4 (of 4 samples) the fraction of prompts with one correct
    with RolloutStore(tmp_path / "run", readonly=True) as store:
        _, rows = store.query(
            "SELECT step, prompt_index, correct, samples FROM eval_prompts ORDER BY step, prompt_index"
        )
    for step in (0, 2):
        mine = [r for r in rows if r[0] == step]
        logged = next(m for m in stored if m["step"] == step and "eval/pass@1" in m)
        assert [r[1] for r in mine] == [0, 1, 2, 3] and {r[3] for r in mine} == {4}
        assert logged["eval/pass@1"] == pytest.approx(sum(r[2] / 4 for r in mine) / 4)
        assert logged["eval/pass@4"] == pytest.approx(sum(r[2] > 0 for r in mine) / 4)
    # TRL's return value: transformers' TrainOutput, about the steps run in this call
    from transformers.trainer_utils import TrainOutput

    assert isinstance(output, TrainOutput) and output.global_step == 2
    losses = [m["loss"] for m in stored if "loss" in m]
    assert output.training_loss == pytest.approx(sum(losses) / 2) == output.metrics["train_loss"]
    m = output.metrics
    assert set(m) == {"train_runtime", "train_samples_per_second", "train_steps_per_second", "train_loss", "epoch"}
    # 2 steps of 8 completions (2 prompts x 4); 30 prompts // 2 per step = 15 steps per epoch
    assert m["train_samples_per_second"] == pytest.approx(16 / m["train_runtime"], rel=1e-2)
    assert m["train_steps_per_second"] == pytest.approx(2 / m["train_runtime"], rel=1e-2)
    assert m["epoch"] == pytest.approx(2 / (len(word_prompts) // 2))
    closing, evaluation = trainer.state.log_history[-2:]  # TRL's closing entry, then evaluate()'s, as in TRL
    assert closing == {**m, "step": 2} and evaluation == {**evals, "step": 2}


def test_chat_prompts(tmp_path, tiny_model_dir):
    prompts = word_prompts(8, 3, chat=True)
    args = tiny_args(tmp_path / "run", max_steps=1)
    trainer = GRPOTrainer(str(tiny_model_dir), TARGET_REWARD, args=args, train_dataset=prompts)
    trainer.train()
    from grpokit.store import RolloutStore

    with RolloutStore(tmp_path / "run", readonly=True) as store:
        prompt = store.rollouts(step=1)[0]["prompt"]
    assert prompt.startswith("user : ") and prompt.endswith("assistant :")  # the chat template was applied


def test_tensorboard_and_wandb_offline(tmp_path, tiny_model_dir, word_prompts, monkeypatch):
    pytest.importorskip("tensorboard")
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_PROJECT", "gsm8k-recipe")  # docs/gpu.md: the W&B project comes from WANDB_PROJECT
    config = write_config(tmp_path, tiny_model_dir, word_prompts, run={"report_to": ["jsonl", "tensorboard", "wandb"]})
    assert main(["train", str(config), "max_steps=2"]) == 0
    run = tmp_path / "run"
    assert list((run / "tensorboard").glob("events.out.tfevents.*"))
    (offline,) = (run / "wandb").glob("offline-run-*")
    (record,) = offline.glob("run-*.wandb")  # the run's record holds its project's name
    assert b"gsm8k-recipe" in record.read_bytes()


def test_explain_prints_sizes(tmp_path, tiny_model_dir, word_prompts, capsys):
    config = write_config(tmp_path, tiny_model_dir, word_prompts)
    assert main(["explain", str(config), "--group_size=8"]) == 0
    out = capsys.readouterr().out
    assert "completions per step:      16  (num_generations 8 x 2 prompts)" in out
    assert "parameters:" in out and not (tmp_path / "run").exists()
    assert "memory estimate (tensors):" in out
    for part in ("weights:", "reference:", "gradients:", "AdamW moments:", "one micro-batch:", "generation:"):
        assert f"  {part}" in out, part
    assert "run 8 rows at a time: backward_chunk_rows" in out  # a tiny model: the whole micro-batch at once


def test_explain_says_why_there_is_no_memory_estimate(tmp_path, tiny_model_dir, word_prompts, capsys):
    config = write_config(
        tmp_path, tiny_model_dir, word_prompts, model={"model_name_or_path": str(tmp_path / "missing")}
    )
    assert main(["explain", str(config)]) == 0
    out = capsys.readouterr().out
    assert "memory estimate:           unavailable (FileNotFoundError: model path" in out and "does not exist" in out


def test_explain_shows_the_first_prompt_built_from_columns(tmp_path, tiny_model_dir, capsys):
    """prompt_template and system_prompt build the prompt from a dataset's columns (here a datasets.load_dataset
    mapping over a JSONL file), rendered by the tokenizer's chat template; the reward columns are named."""
    rows = [{"question": f"w{i} w{i + 1}", "target": "w7"} for i in range(8)]
    config = write_config(
        tmp_path, tiny_model_dir, rows, data={"prompt_template": "{question} w9", "system_prompt": "w3"}
    )
    data = {"path": "json", "data_files": str(tmp_path / "train.jsonl")}
    assert main(["explain", str(config), f"train_dataset={json.dumps(data)}"]) == 0
    out = capsys.readouterr().out
    first = out.split("# first prompt (train_dataset row 0, as the model reads it)\n", 1)[1].splitlines()
    # conftest's chat template: "{role} : {content} " per message, then "assistant :"
    assert first[0] == "system : w3 user : w0 w1 w9 assistant :"
    assert first[1] == "# reward functions also get the columns: question, target"
    assert "prompt_template: '{question} w9'" in out and "    path: json" in out  # the resolved config shows both

    # a hub dataset offline: explain still prints everything else and says why there is no prompt
    assert main(["explain", str(config), "train_dataset=hf:openai/gsm8k:main:train"]) == 0
    out = capsys.readouterr().out
    assert "unavailable: DataError: train_dataset: 'openai/gsm8k' is not in the local datasets cache" in out


def test_config_error_is_one_clear_message(tmp_path, tiny_model_dir, word_prompts, capsys):
    config = write_config(tmp_path, tiny_model_dir, word_prompts)
    assert main(["train", str(config), "num_generation=3"]) == 2
    assert "unknown config key 'num_generation'. Did you mean 'num_generations'?" in capsys.readouterr().err


def test_max_kl_stops_with_a_checkpoint_and_eval_cli_reads_the_run(tmp_path, tiny_model_dir, word_prompts, capsys):
    # lr 0.05 moves this tiny policy far from its reference in one step; max_kl 1e-6 then trips at once
    config = write_config(
        tmp_path,
        tiny_model_dir,
        word_prompts,
        algo={"max_kl": 1e-6, "max_kl_patience": 2},
        optim={"learning_rate": 0.05, "max_steps": 10},
        eval={"num_generations_eval": 2, "pass_at_k": [1, 2]},
    )
    assert main(["train", str(config)]) == 0
    run = tmp_path / "run"
    steps = [m["step"] for m in read_metrics(run)]
    assert steps == [1, 2, 3]  # kl is 0 at step 1 (policy == reference), over max_kl at steps 2 and 3
    assert "exceeded max_kl=1e-06 for 2 step(s)" in capsys.readouterr().err
    assert (run / "checkpoints" / "step-3").is_dir() and (run / "final").is_dir()
    data = tmp_path / "train.jsonl"
    assert main(["eval", str(run), f"eval_dataset={data}", "max_eval_prompts=4"]) == 0
    metrics = json.loads(capsys.readouterr().out)
    assert 0.0 <= metrics["eval/pass@1"] <= metrics["eval/pass@2"] <= 1.0 and metrics["eval/num_prompts"] == 4.0


def test_bias_corrected_kl_is_wired_from_the_config(tmp_path, tiny_model_dir, word_prompts):
    # The importance-weighted KL r * k3 has the value of k3 on-policy (r = 1) but another gradient
    # (k3 grad logp is added), and both vanish at step 1, where the policy is the reference: the two
    # runs agree through step 2's metrics and part from step 3 on, whose rollouts come from different weights.
    runs = {}
    for corrected in (False, True):
        folder = tmp_path / str(corrected)
        folder.mkdir()
        config = write_config(
            folder,
            tiny_model_dir,
            word_prompts,
            algo={"use_bias_correction_kl": corrected, "beta": 0.5},
            optim={"max_steps": 3},
        )
        assert main(["train", str(config)]) == 0
        runs[corrected] = read_metrics(folder / "run")
    plain, corrected = runs[False], runs[True]
    for key in ("reward", "loss", "kl"):
        assert [m[key] for m in plain[:2]] == pytest.approx([m[key] for m in corrected[:2]], abs=1e-6), key
    assert plain[2]["kl"] != pytest.approx(corrected[2]["kl"], abs=1e-9)
