"""A bf16 run through the Python API with the cast-once Linears on (``Kernels.cast_once_linears``, off by default)
against the same run with the defaults: the policy's forward goes through them, and the logged losses agree within
bf16 rounding."""

from __future__ import annotations

import dataclasses
import json

import pytest
from shared_helpers import TARGET_REWARD, tiny_args

from grpokit import GRPOTrainer
from grpokit.kernels import Kernels, cast_linears

pytestmark = pytest.mark.usefixtures("one_thread")


def train(tmp_path, name, tiny_model_dir, word_prompts):
    args = tiny_args(tmp_path / name, mixed_precision="bf16", num_iterations=2, seed=3)
    GRPOTrainer(str(tiny_model_dir), TARGET_REWARD, args=args, train_dataset=word_prompts).train()
    return [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]


def test_bf16_run_with_and_without_cast_once_linears(tmp_path, tiny_model_dir, word_prompts, monkeypatch):
    calls = []
    apply = cast_linears.CastLinear.apply
    monkeypatch.setattr(cast_linears.CastLinear, "apply", lambda *a: calls.append(1) or apply(*a))
    plain = train(tmp_path, "plain", tiny_model_dir, word_prompts)
    assert not calls  # the default: autocast's own casts
    select = Kernels.select
    monkeypatch.setattr(Kernels, "select", lambda *a, **k: dataclasses.replace(select(*a, **k), cast_once_linears=True))
    cast = train(tmp_path, "cast", tiny_model_dir, word_prompts)
    assert calls  # the policy's forward went through the cast-once Linears
    losses = [[m["loss"] for m in run if "loss" in m] for run in (cast, plain)]
    assert len(losses[0]) == len(losses[1]) >= 1
    for a, b in zip(*losses):
        assert abs(a - b) <= 2e-2 * max(1.0, abs(b)), losses
