"""FSDP (FSDP2, ``distributed.strategy: fsdp``) on CPU with gloo: 2 sharded processes against one
process, an exact resume from a checkpoint gathered to rank 0, and evaluation on rank 0."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file
from test_distributed import read_metrics, torchrun, write_config

from grpokit.cli import main
from grpokit.store import RolloutStore

pytestmark = pytest.mark.slow


def configure(path: Path, **sections) -> Path:
    data = yaml.safe_load(path.read_text())
    for section, values in sections.items():
        data.setdefault(section, {}).update(values)
    path.write_text(yaml.safe_dump(data))
    return path


def fsdp_config(tmp_path, model_dir, prompts, name, **run) -> Path:
    path = write_config(
        tmp_path, model_dir, prompts, name, per_device_train_batch_size=4, gradient_accumulation_steps=1
    )
    eval_data = tmp_path / "eval.jsonl"
    eval_data.write_text("".join(json.dumps(r) + "\n" for r in prompts[:4]))
    return configure(
        path,
        distributed={"strategy": "fsdp"},
        algo={"ref_model_sync_steps": 2, "ref_model_mixup_alpha": 0.5},
        data={"eval_dataset": str(eval_data)},
        eval={"eval_steps": 2, "num_generations_eval": 2, "pass_at_k": [1]},
        run=run,
    )


def rollouts_of(run: Path) -> list[dict]:
    with RolloutStore(run / "rollouts.sqlite", readonly=True) as store:
        return store.rollouts()


def test_two_fsdp_processes_match_one_process_and_resume_exactly(tmp_path, tiny_model_dir, word_prompts):
    # Same global batch as the DDP test: 1 process x 4 x 2 accumulation = 2 FSDP processes x 4 x 1.
    one = configure(
        write_config(
            tmp_path, tiny_model_dir, word_prompts, "one", per_device_train_batch_size=4, gradient_accumulation_steps=2
        ),
        algo={"ref_model_sync_steps": 2, "ref_model_mixup_alpha": 0.5},
    )
    assert main(["train", str(one)]) == 0
    straight = fsdp_config(tmp_path, tiny_model_dir, word_prompts, "fsdp", save_steps=1)
    torchrun(straight)

    # Tolerance 1e-5, as for DDP: the forward passes see the same float32 weights (all-gathered shards
    # are exact copies); only the gradient reduction (reduce-scatter of 2 ranks vs accumulation over
    # 2 micro-batches in one process) rounds differently, ~1e-7 relative per step.
    m1, m2 = read_metrics(tmp_path / "one"), read_metrics(tmp_path / "fsdp")
    train2 = [m for m in m2 if "loss" in m]
    assert [m["step"] for m in train2] == [1, 2, 3]
    for a, b in zip(m1, train2):
        assert a["reward"] == pytest.approx(b["reward"], abs=1e-6)  # identical rollouts: sampling on gathered weights
        assert a["loss"] == pytest.approx(b["loss"], abs=1e-5)
        assert a["kl"] == pytest.approx(b["kl"], abs=1e-5)  # the sharded reference, resynced at step 2
    assert all(m["advantage/std"] > 0 for m in m1)
    with RolloutStore(tmp_path / "fsdp" / "rollouts.sqlite", readonly=True) as store:
        evals = store.evals()
    assert sorted({e["step"] for e in evals}) == [
        0,
        2,
        3,
    ]  # rank 0 evaluated on the gathered weights (start, eval_steps, end)
    rows = rollouts_of(tmp_path / "fsdp")
    assert len(rows) == len({(r["step"], r["prompt_index"], r["completion_index"]) for r in rows}) == 3 * 8

    # The checkpoint holds full tensors gathered to rank 0, equal to one process's weights within 1e-5.
    full = load_file(tmp_path / "fsdp" / "checkpoints" / "step-2" / "model.safetensors")
    assert (tmp_path / "fsdp" / "checkpoints" / "step-2" / "reference.safetensors").is_file()
    from transformers import AutoModelForCausalLM

    single = AutoModelForCausalLM.from_pretrained(tmp_path / "one" / "final")
    sharded = AutoModelForCausalLM.from_pretrained(tmp_path / "fsdp" / "final")
    for (name, p), q in zip(single.named_parameters(), sharded.parameters()):
        assert p.shape == q.shape == full[name].shape
        torch.testing.assert_close(p, q, atol=1e-5, rtol=0)
    assert any(
        not torch.equal(p, q)
        for p, q in zip(AutoModelForCausalLM.from_pretrained(tiny_model_dir).parameters(), sharded.parameters())
    )

    # Exact resume: 2 steps, then resume_from=latest with max_steps=3 gives the straight run's step 3.
    resumed = fsdp_config(tmp_path, tiny_model_dir, word_prompts, "resumed", save_steps=1)
    configure(resumed, optim={"max_steps": 2})
    torchrun(resumed)
    configure(resumed, optim={"max_steps": 3}, run={"resume_from": "latest"})
    torchrun(resumed)
    m3 = [m for m in read_metrics(tmp_path / "resumed") if "loss" in m]
    assert [m["step"] for m in m3] == [1, 2, 3]
    for key in ("loss", "kl", "reward", "grad_norm"):
        assert m3[2][key] == train2[2][key], key
    sharded_rows = {(r["step"], r["prompt_index"], r["completion_index"]): r["completion"] for r in rows}
    assert {
        (r["step"], r["prompt_index"], r["completion_index"]): r["completion"]
        for r in rollouts_of(tmp_path / "resumed")
    } == sharded_rows
