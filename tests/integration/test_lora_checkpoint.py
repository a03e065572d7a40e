"""LoRA checkpoints hold the adapters only: far smaller than the base, exact resume (2 + 2 steps = 4 steps),
adapters that do not match the run's lora settings are a clear error (exit 2 through the CLI). QLoRA: test_qlora.py."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file
from shared_helpers import PROMPTS, TARGET_REWARD, tiny_args

from grpokit import GRPOConfig, GRPOTrainer
from grpokit.cli import main
from grpokit.train.rundir.checkpoint import list_checkpoints

peft = pytest.importorskip("peft")

# Per-step numbers that must agree between a straight run and a resumed one (as in test_resume.py).
COMPARED = ("loss", "policy_loss", "kl", "grad_norm", "entropy", "reward", "learning_rate", "completion_logprob_mean")
LORA = {"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj", "down_proj"]}


pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: see conftest.one_thread


config = functools.partial(
    tiny_args,
    lora=LORA,
    max_steps=4,
    max_completion_length=5,
    learning_rate=5e-2,
    lr_scheduler_type="constant",
    beta=0.1,
    algo={"num_iterations": 2},  # grpokit's form: max_steps counts generation batches
    save_steps=2,
    seed=0,
)


def train(model_dir, args: GRPOConfig) -> GRPOTrainer:
    trainer = GRPOTrainer(str(model_dir), TARGET_REWARD, args=args, train_dataset=PROMPTS)
    trainer.train()
    return trainer


def metrics(run: Path) -> list[dict]:
    return [m for line in (run / "metrics.jsonl").read_text().splitlines() if "loss" in (m := json.loads(line))]


@pytest.fixture(scope="module")
def straight_run(tmp_path_factory, tiny_model_dir):
    run = tmp_path_factory.mktemp("lora-straight") / "run"
    train(tiny_model_dir, config(run))
    return run


def test_lora_checkpoint_holds_the_adapters_and_resume_equals_a_straight_run(straight_run, tiny_model_dir, tmp_path):
    run = tmp_path / "run"
    first = train(tiny_model_dir, config(run, max_steps=2))
    file = run / "checkpoints" / "step-2" / "model.safetensors"
    saved = load_file(file)
    trained = {n: p for n, p in first.model.named_parameters() if p.requires_grad}
    assert saved.keys() == trained.keys() and all("lora_" in name for name in saved)
    for name, tensor in saved.items():
        torch.testing.assert_close(tensor, trained[name].detach(), rtol=0, atol=0)
    with safe_open(str(file), framework="pt") as f:
        assert f.metadata()["grpokit_weights"] == "trainable-only"
    base_bytes = (Path(tiny_model_dir) / "model.safetensors").stat().st_size
    assert file.stat().st_size < base_bytes / 5, (file.stat().st_size, base_bytes)

    train(tiny_model_dir, config(run, resume_from="latest"))
    straight, resumed = metrics(straight_run), metrics(run)
    assert [m["step"] for m in straight] == [m["step"] for m in resumed] == [1, 2, 3, 4]
    for x, y in zip(straight, resumed):
        for key in COMPARED:
            assert x[key] == pytest.approx(y[key], abs=1e-6), (x["step"], key)
    wa, wb = (load_file(r / "final" / "adapter_model.safetensors") for r in (straight_run, run))
    assert wa.keys() == wb.keys() and wa
    for name in wa:
        torch.testing.assert_close(wa[name], wb[name], atol=1e-6, rtol=0)
    assert any(
        w.abs().max() > 0 for name, w in wb.items() if "lora_B" in name
    )  # the adapters did train (B starts at 0)


@pytest.mark.parametrize(
    "override, message",
    [
        ("r=8", r"has shape \[4, 32\] in the checkpoint and \[8, 32\] in this model"),
        (
            "target_modules=[q_proj]",
            r"holds the trainable parameters only \(LoRA adapters\) and they do not match this model's \(missing \[\], "
            r"unexpected \[",
        ),
    ],
)
def test_resuming_with_other_lora_settings_exits_2_naming_the_problem(
    straight_run, tiny_model_dir, tmp_path, capsys, override, message
):
    import re

    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in PROMPTS))
    (tmp_path / "c.yaml").write_text(
        f"model: {{model_name_or_path: {tiny_model_dir}}}\ndata: {{train_dataset: {data}}}\nrewards: "
        f"['{TARGET_REWARD}']\n"
        f"lora: {json.dumps(LORA)}\nnum_generations: 4\nbeta: 0.1\nmax_completion_length: "
        "5\nper_device_train_batch_size: 8\n"
        "max_steps: 4\nprogress_bar: false\nreport_to: [jsonl]\n"
    )
    checkpoint = list_checkpoints(straight_run)[0]
    code = main(
        ["train", str(tmp_path / "c.yaml"), f"output_dir={tmp_path / 'run'}", f"resume_from={checkpoint}", override]
    )
    err = capsys.readouterr().err
    assert code == 2, err
    assert re.search(message, err), err
    assert "resume with the same model and lora settings" in err


def test_lora_adapters_start_from_the_seed(tiny_model_dir, tmp_path):
    """Two trainers with the same seed start from the same adapters, whatever used the global RNG before."""

    def adapters():
        trainer = GRPOTrainer(str(tiny_model_dir), TARGET_REWARD, args=config(tmp_path / "run"), train_dataset=PROMPTS)
        return {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}

    a = adapters()
    torch.rand(7)  # moves the global RNG on
    b = adapters()
    assert a.keys() == b.keys()
    assert any(
        w.abs().max() > 0 for name, w in a.items() if "lora_A" in name
    )  # lora_A is random, lora_B starts at zero
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=0, msg=name)
