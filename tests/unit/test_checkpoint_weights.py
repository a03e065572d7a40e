"""Checkpoint weights: with frozen parameters (LoRA) only the trainable ones are written and loaded back into
a model whose frozen part comes from the source; full fine-tuning writes the whole model (tied weights once)."""

from __future__ import annotations

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from grpokit.train.rundir.checkpoint import CheckpointError, load_checkpoint, save_checkpoint


class Adapted(torch.nn.Module):
    """A frozen base and a trainable low-rank pair, like a LoRA-wrapped layer (rank ``r``)."""

    def __init__(self, r: int = 2, seed: int = 0):
        super().__init__()
        torch.manual_seed(seed)
        self.base = torch.nn.Linear(4, 4)
        self.lora_A = torch.nn.Linear(4, r, bias=False)
        self.lora_B = torch.nn.Linear(r, 4, bias=False)
        self.base.requires_grad_(False)


class Tied(torch.nn.Module):
    """Full fine-tuning with tied embedding / head weights."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(5, 3)
        self.head = torch.nn.Linear(3, 5, bias=False)
        self.head.weight = self.embed.weight


def parts(model):
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=0.1)
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)


def save(run, model):
    return save_checkpoint(run, 1, model, *parts(model), trainer_state={}, rng_states={})


def metadata(file):
    with safe_open(str(file), framework="pt") as f:
        return f.metadata()


def test_frozen_parameters_are_left_out_and_resume_loads_the_trainable_ones(tmp_path):
    trained = Adapted(seed=0)
    with torch.no_grad():
        trained.lora_B.weight.fill_(0.5)  # as if trained: differs from any fresh init
    folder = save(tmp_path, trained)
    file = folder / "model.safetensors"
    saved = load_file(file)
    assert sorted(saved) == ["lora_A.weight", "lora_B.weight"]  # names as in named_parameters, no base.*
    assert metadata(file)["grpokit_weights"] == "trainable-only"
    # 2 tensors of 2x4 and 4x2 float32 = 64 bytes of data, against 4x4 + 4 = 80 bytes for the frozen base alone
    assert sum(t.numel() * t.element_size() for t in saved.values()) == 64

    resumed = Adapted(seed=1)  # different adapters; its base is what a resume loads from the source
    resumed.base.load_state_dict(trained.base.state_dict())
    load_checkpoint(folder, resumed, *parts(resumed))
    for (name, a), (_, b) in zip(trained.named_parameters(), resumed.named_parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)
    assert [n for n, p in resumed.named_parameters() if p.requires_grad] == [
        "lora_A.weight",
        "lora_B.weight",
    ]  # still trainable


def test_full_fine_tuning_writes_the_whole_model_once_per_tied_weight(tmp_path):
    model = Tied()
    folder = save(tmp_path, model)
    file = folder / "model.safetensors"
    assert len(load_file(file)) == 1  # embed.weight and head.weight are one tensor, written once
    assert "grpokit_weights" not in (metadata(file) or {})
    fresh = Tied()
    load_checkpoint(folder, fresh, *parts(fresh))
    torch.testing.assert_close(fresh.head.weight, model.embed.weight, rtol=0, atol=0)


@pytest.mark.parametrize(
    "other, message",
    [
        (lambda: Adapted(r=3), r"lora_A.weight has shape \[2, 4\] in the checkpoint and \[3, 4\] in this model"),
        (
            lambda: Adapted().requires_grad_(True),
            r"trainable parameters only .*\(missing \['base.bias', 'base.weight'\], unexpected \[\]\)",
        ),
    ],
)
def test_adapters_that_do_not_match_are_a_clear_error(tmp_path, other, message):
    folder = save(tmp_path, Adapted(r=2))
    model = other()
    with pytest.raises(CheckpointError, match=message):
        load_checkpoint(folder, model, *parts(model))


def test_a_trainable_only_checkpoint_with_an_unexpected_key_is_refused(tmp_path):
    folder = save(tmp_path, Adapted())
    model = Adapted()
    model.lora_B.requires_grad_(False)  # the model trains fewer parameters than the checkpoint holds
    with pytest.raises(
        CheckpointError,
        match=r"missing \[\], unexpected \['lora_B.weight'\]\); resume with the same model and lora settings",
    ):
        load_checkpoint(folder, model, *parts(model))
