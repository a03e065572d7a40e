"""Non-finite loss or gradients: the update is skipped (weights and optimizer state untouched), the
step is logged with its rollouts, and the run stops with a message after max_nonfinite_steps in a row."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from shared_helpers import tiny_args, tiny_run_config, word_prompts

from grpokit import GRPOTrainer
from grpokit.cli import main
from grpokit.store import RolloutStore
from grpokit.train.rundir.checkpoint import list_checkpoints

PROMPTS = word_prompts(16, 4, target=None)
args = functools.partial(tiny_args, max_steps=5, learning_rate=1e-2, beta=0.0, max_nonfinite_steps=2, save_steps=0)


def one_per_word(prompts, completions, **columns):
    return [float(len(c.split())) for c in completions]


def logged(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def weights(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def inject_nan_in_training(model, steps: set[int], trainer_ref: list) -> None:
    """NaN hidden states in the forward passes that build the loss (grad enabled) at the given steps
    only; sampling and the reference pass run without grad and stay finite. The hook sits on the
    decoder's final norm, which every log-prob path (plain logits or the fused LM head) runs."""

    def hook(module, inputs, output):
        if torch.is_grad_enabled() and trainer_ref[0].step in steps:
            return output * float("nan")
        return output

    model.get_decoder().norm.register_forward_hook(hook)


def test_nan_every_step_skips_updates_and_stops_after_max_in_a_row(tmp_path, tiny_model_dir, capsys):
    run = tmp_path / "run"
    trainer = GRPOTrainer(str(tiny_model_dir), one_per_word, args=args(run), train_dataset=PROMPTS)
    inject_nan_in_training(trainer.model, steps=set(range(1, 6)), trainer_ref=[trainer])
    before = weights(trainer.model)
    trainer.train()

    assert trainer.step == 2  # max_nonfinite_steps = 2 in a row
    assert "2 steps in a row had a non-finite loss or gradient (updates skipped)" in trainer.stop_reason
    assert "stopped at step 2" in capsys.readouterr().err
    assert [m["nonfinite"] for m in logged(run)] == [1.0, 1.0]
    for name, tensor in weights(trainer.model).items():
        assert torch.equal(tensor, before[name]), name
    for state in trainer.optimizer.state.values():  # AdamW never stepped: its state is still the one made before
        assert float(state["step"]) == 0  # the first step, no moments built from NaN gradients
        assert not state["exp_avg"].any() and not state["exp_avg_sq"].any()
    with RolloutStore(run / "rollouts.sqlite", readonly=True) as store:
        assert store.steps() == [1, 2]
        assert len(store.rollouts(step=2)) == 8  # the skipped step's rollouts are kept for inspection
        assert store.metrics()[-1]["nonfinite"] == 1.0
    assert [p.name for p in list_checkpoints(run)] == ["step-2"]  # a checkpoint to resume from


def test_isolated_nonfinite_steps_are_skipped_without_stopping(tmp_path, tiny_model_dir):
    """Steps 2 and 4 are non-finite, never two in a row: the run goes on, and only they skip the update."""
    run = tmp_path / "run"
    trainer = GRPOTrainer(str(tiny_model_dir), one_per_word, args=args(run), train_dataset=PROMPTS)
    inject_nan_in_training(trainer.model, steps={2, 4}, trainer_ref=[trainer])
    snapshots = []
    after_step = trainer.loop._after_step

    def record(step_metrics):
        snapshots.append(weights(trainer.model))
        after_step(step_metrics)

    trainer.loop._after_step = record
    start = weights(trainer.model)
    trainer.train()

    assert trainer.step == 5 and trainer.stop_reason is None
    assert [m["nonfinite"] for m in logged(run)] == [0.0, 1.0, 0.0, 1.0, 0.0]
    before = [start, *snapshots[:-1]]
    name = next(iter(start))
    changed = [not torch.equal(b[name], a[name]) for b, a in zip(before, snapshots)]
    assert changed == [True, False, True, False, True]


def write_cli_config(tmp_path: Path, model_dir, reward_body: str, **algo) -> Path:
    reward_file = tmp_path / "rewards.py"
    reward_file.write_text(f"def reward(prompts, completions, **columns):\n    return {reward_body}\n")
    return tiny_run_config(
        tmp_path,
        model_dir,
        max_steps=5,
        rewards=[f"{reward_file}:reward"],
        algo={"beta": 0.0, **algo},
        run={"max_nonfinite_steps": 3},
    )


def test_huge_rewards_overflow_the_gradient_and_the_cli_exits_1(tmp_path, tiny_model_dir, capsys):
    """Rewards of 3e38 and 0 (finite in float32) without advantage scaling: advantages of +-1.5e38
    overflow the gradient norm to inf, so every update is skipped and the run stops after 3 steps."""
    config = write_cli_config(
        tmp_path, tiny_model_dir, "[3e38 * (i % 2) for i in range(len(completions))]", scale_rewards="none"
    )
    initial = load_file(Path(tiny_model_dir) / "model.safetensors")
    assert main(["train", str(config)]) == 1
    assert "3 steps in a row had a non-finite loss or gradient" in capsys.readouterr().err
    run = tmp_path / "run"
    assert [m["nonfinite"] for m in logged(run)] == [1.0] * 3
    final = load_file(run / "final" / "model.safetensors")
    for name in initial:
        assert torch.equal(initial[name], final[name]), name


def test_a_reward_beyond_float32_does_not_crash_the_run(tmp_path, tiny_model_dir):
    config = write_cli_config(tmp_path, tiny_model_dir, "[1e39 * (i % 2) for i in range(len(completions))]")
    assert main(["train", str(config)]) == 0  # rewards are float64, so 1e39 is a value and group scaling keeps A finite


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_nonfinite_reward_values_become_none_and_training_goes_on(tmp_path, tiny_model_dir, value):
    """A reward that returns NaN or inf for some completions: those values are dropped (counted as
    errors), the rest still train."""

    def sometimes_bad(prompts, completions, **columns):
        return [value if i % 4 == 0 else float(len(c.split())) for i, c in enumerate(completions)]

    run = tmp_path / "run"
    trainer = GRPOTrainer(str(tiny_model_dir), sometimes_bad, args=args(run, max_steps=2), train_dataset=PROMPTS)
    trainer.train()
    metrics = logged(run)
    assert [m["nonfinite"] for m in metrics] == [0.0, 0.0]
    assert all(m["rewards/sometimes_bad/errors"] == 2.0 for m in metrics)  # 8 completions, every 4th is bad
