"""Exact resume: N steps in one go equal k steps + resume + N - k steps; broken checkpoints give a clear error."""

from __future__ import annotations

import functools
import json
import os
import signal
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from shared_helpers import PROMPTS, TARGET_REWARD, signal_after_step, tiny_args

from grpokit import GRPOConfig, GRPOTrainer
from grpokit.cli import main
from grpokit.store import RolloutStore
from grpokit.train.rundir.checkpoint import CheckpointError, list_checkpoints
from grpokit.train.rundir.manifest import read_manifest, write_manifest

# Per-step numbers that must agree between a straight run and a resumed one.
COMPARED = ("loss", "policy_loss", "kl", "grad_norm", "entropy", "reward", "learning_rate", "completion_logprob_mean")


config = functools.partial(
    tiny_args,
    max_steps=6,
    max_completion_length=5,
    learning_rate=5e-3,
    beta=0.04,
    algo={"num_iterations": 2},  # grpokit's form: max_steps counts generation batches
    save_steps=1,
)


def trainer(model_dir, prompts, args: GRPOConfig) -> GRPOTrainer:
    return GRPOTrainer(str(model_dir), TARGET_REWARD, args=args, train_dataset=prompts)


def metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def completions(run: Path) -> list[tuple]:
    with RolloutStore(run / "rollouts.sqlite", readonly=True) as store:
        return [(r["step"], r["prompt_index"], r["completion"]) for r in store.rollouts()]


def assert_same_run(a: Path, b: Path) -> None:
    ma, mb = metrics(a), metrics(b)
    assert [m["step"] for m in ma] == [m["step"] for m in mb] == list(range(1, 7))
    for x, y in zip(ma, mb):
        for key in COMPARED:
            assert x[key] == pytest.approx(y[key], abs=1e-6), (x["step"], key)
    assert completions(a) == completions(b)
    wa, wb = load_file(a / "final" / "model.safetensors"), load_file(b / "final" / "model.safetensors")
    assert wa.keys() == wb.keys()
    for name in wa:
        torch.testing.assert_close(wa[name], wb[name], atol=1e-6, rtol=0)


@pytest.fixture(scope="module")
def straight_runs(tmp_path_factory, tiny_model_dir):
    """Reference runs of 6 steps in one go, by learning-rate schedule."""
    prompts = PROMPTS
    runs = {}
    for schedule in ("constant", "linear"):
        run = tmp_path_factory.mktemp(f"straight-{schedule}") / "run"
        trainer(tiny_model_dir, prompts, config(run, lr_scheduler_type=schedule, ref_model_sync_steps=2)).train()
        runs[schedule] = run
    return runs, prompts


@pytest.mark.slow
def test_three_steps_then_resume_three_more_equals_six(straight_runs, tiny_model_dir, tmp_path):
    """A finished 3-step run, resumed with max_steps=6 (constant learning rate, so the schedule agrees)."""
    runs, prompts = straight_runs
    run = tmp_path / "run"
    args = config(run, lr_scheduler_type="constant", ref_model_sync_steps=2)
    trainer(tiny_model_dir, prompts, args.replace(max_steps=3)).train()
    assert [p.name for p in list_checkpoints(run)] == ["step-2", "step-3"]
    assert (run / "checkpoints" / "step-2" / "reference.safetensors").exists()  # the resynced reference is saved
    trainer(tiny_model_dir, prompts, args.replace(resume_from="latest")).train()
    assert_same_run(runs["constant"], run)


@pytest.mark.slow
def test_interrupted_at_step_three_then_resumed_equals_six(straight_runs, tiny_model_dir, tmp_path):
    """A 6-step run stopped by SIGINT after step 3 (linear decay over 6 steps), then resumed."""
    runs, prompts = straight_runs
    run = tmp_path / "run"
    args = config(run, lr_scheduler_type="linear", ref_model_sync_steps=2)
    first = trainer(tiny_model_dir, prompts, args)
    signal_after_step(first, 3, signal.SIGINT)  # the trainer's handler turns it into a stop after the step
    handler_before = signal.getsignal(signal.SIGINT)
    first.train()
    assert first.interrupted_by == signal.SIGINT and first.step == 3
    assert list_checkpoints(run)[-1].name == "step-3"
    assert signal.getsignal(signal.SIGINT) is handler_before  # train() puts the caller's handler back
    trainer(tiny_model_dir, prompts, args.replace(resume_from="latest")).train()
    assert_same_run(runs["linear"], run)


# ---- broken checkpoints ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def finished_run(tmp_path_factory, tiny_model_dir):
    run = tmp_path_factory.mktemp("one-step") / "run"
    trainer(tiny_model_dir, PROMPTS, config(run, max_steps=1, num_iterations=1, per_device_train_batch_size=4)).train()
    return run, PROMPTS


def broken_copy(run: Path, tmp_path: Path) -> Path:
    """A copy of the finished run folder; returns its checkpoint, for the test to damage."""
    import shutil

    shutil.copytree(run, tmp_path / "run")
    return list_checkpoints(tmp_path / "run")[-1]


def truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def resealed(damage):
    """``damage``, then the manifest rewritten to match: a checkpoint whose files are as written, but not loadable."""

    def apply(ckpt: Path) -> None:
        damage(ckpt)
        write_manifest(ckpt, read_manifest(ckpt)["run"])

    return apply


class NotATensor:
    """Pickled into states.pt: weights_only loading must refuse to run its code."""

    def __reduce__(self):
        return (os.system, ("echo unsafe",))


@pytest.mark.parametrize(
    "damage, message",
    [
        (
            lambda ckpt: truncate(ckpt / "model.safetensors"),
            r"model.safetensors is truncated \(\d+ bytes, \d+ expected",
        ),
        (lambda ckpt: truncate(ckpt / "states.pt"), r"states.pt is truncated"),
        (
            resealed(lambda ckpt: torch.save({"optimizer": NotATensor()}, ckpt / "states.pt")),
            "cannot read the checkpoint",
        ),
        (resealed(lambda ckpt: truncate(ckpt / "model.safetensors")), "may be truncated"),
        (
            resealed(
                lambda ckpt: (ckpt / "trainer_state.json").write_text('{"step": 1, "grpokit_version": "0.0.0-other"}')
            ),
            "was written by grpokit '0.0.0-other'",
        ),
        (
            resealed(lambda ckpt: (ckpt / "trainer_state.json").write_text('{"step": 1, "grpok')),
            "trainer_state.json is missing or corrupt",
        ),
    ],
)
def test_a_broken_checkpoint_gives_a_clear_error(finished_run, tiny_model_dir, tmp_path, damage, message):
    """Damage the manifest sees (sizes, checksums) is refused before loading; files that match a rewritten manifest
    but do not load (foreign pickles, another version, torn weights) are refused by the loader."""
    run, prompts = finished_run
    checkpoint = broken_copy(run, tmp_path)
    damage(checkpoint)
    resumed = trainer(
        tiny_model_dir,
        prompts,
        config(tmp_path / "run", max_steps=2, num_iterations=1, per_device_train_batch_size=4, resume_from="latest"),
    )
    with pytest.raises(CheckpointError, match=message):
        resumed.train()


def test_resume_from_a_folder_that_is_not_a_checkpoint_fails_before_the_model_loads(tmp_path, capsys, monkeypatch):
    from grpokit.compose import run as setup

    monkeypatch.setattr(setup, "build_policy", lambda *a, **k: pytest.fail("the model was loaded"))
    (tmp_path / "data.jsonl").write_text('{"prompt": "w1 w2", "target": "w1"}\n')
    (tmp_path / "c.yaml").write_text(
        f"data: {{train_dataset: {tmp_path / 'data.jsonl'}}}\nrewards: ['{TARGET_REWARD}']\n"
        f"model: {{model_name_or_path: {tmp_path / 'model'}}}\n"
    )
    code = main(["train", str(tmp_path / "c.yaml"), f"output_dir={tmp_path / 'run'}", f"resume_from={tmp_path}"])
    assert code == 2
    assert "is not a checkpoint folder (no trainer_state.json)" in capsys.readouterr().err
