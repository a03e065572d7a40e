"""Several optimizer steps per generation batch: num_mini_batches (TRL: steps_per_generation, generation_batch_size)."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from shared_helpers import PROMPTS, TARGET_REWARD, tiny_args

from grpokit import GRPOConfig, GRPOTrainer
from grpokit.store import RolloutStore
from grpokit.train.learning.policy_logprobs import batched_logprobs, build_batch

config = functools.partial(
    tiny_args,
    num_generations=2,
    max_completion_length=5,
    learning_rate=5e-3,
    lr_scheduler_type="constant",
    beta=0.04,
    dtype="float32",
    save_steps=1,
)


def trainer(model_dir, args: GRPOConfig) -> GRPOTrainer:
    return GRPOTrainer(str(model_dir), TARGET_REWARD, args=args, train_dataset=PROMPTS)


def test_one_generation_feeds_steps_per_generation_optimizer_steps(tiny_model_dir, tmp_path):
    """TRL's steps_per_generation=2 with gradient_accumulation_steps=1: each step samples 8 completions (4 prompts x
    G=2) in one generate call and takes 2 optimizer steps, the first on rows 0-3, the second on rows 4-7."""
    # TRL's max_steps=4 counts optimizer steps: 2 generation batches of 2
    args = config(tmp_path / "run", steps_per_generation=2, gradient_accumulation_steps=1, max_steps=4)
    assert args.num_mini_batches == 2 and args.completions_per_step() == 8 and args.max_steps == 2
    t = trainer(tiny_model_dir, args)
    generated, seen, sampled = [], [], []
    source = t.rollout_scheduler.source
    generate, next_rollouts, accumulate = t.engine.generate, source.next, t.learner._accumulate
    t.engine.generate = lambda *a, **k: generated.append(1) or generate(*a, **k)
    source.next = lambda step, draw: (out := next_rollouts(step, draw), sampled.append(out[1]))[0]
    t.learner._accumulate = lambda part, **kw: seen.append(part.batch.completion_ids.clone()) or accumulate(part, **kw)
    t.train()
    stepped = {int(state["step"]) for state in t.optimizer.state.values()}  # AdamW counts its steps per parameter
    assert len(generated) == 2 and stepped == {4}  # 2 steps x 1 generation, 2 x 2 optimizer steps
    assert len(seen) == 4
    for step, rollouts in enumerate(sampled):
        assert rollouts.completion_ids.size(0) == 8
        assert torch.equal(seen[2 * step], rollouts.completion_ids[0:4])  # mini-batch 1: prompts 0-1, both groups
        assert torch.equal(seen[2 * step + 1], rollouts.completion_ids[4:8])  # mini-batch 2: prompts 2-3
    assert t.scheduler.last_epoch == 4  # the learning-rate schedule counts optimizer steps
    with RolloutStore(tmp_path / "run" / "rollouts.sqlite", readonly=True) as store:
        rows = store.rollouts()
    assert [sum(r["step"] == s for r in rows) for s in (1, 2)] == [8, 8]  # each completion stored once


@pytest.mark.parametrize("loss_type", ["grpo", "dapo"])
def test_mini_batches_equal_separate_updates_on_the_slices(tiny_model_dir, tmp_path, loss_type):
    """One update with num_mini_batches=2 on 8 rows = two updates with num_mini_batches=1 on rows 0-3 and 4-7, with the
    same old log-probs and, for dapo, each with half the batch's token count as denominator (TRL rescales
    num_items_in_batch by gradient_accumulation_steps / steps_per_generation = 1/2)."""
    split = trainer(tiny_model_dir, config(tmp_path / "a", num_mini_batches=2, loss_type=loss_type))
    whole = trainer(tiny_model_dir, config(tmp_path / "b", loss_type=loss_type))
    rollouts = split.engine.generate([split.train_source.ids[i] for i in range(4)], 2, split.sampling)
    batch = build_batch(split.model, rollouts, split.tokenizer.pad_token_id, split.device)
    advantages = torch.tensor([1.0, -1.0, 0.5, -0.5, 2.0, -2.0, 0.25, -0.25])  # [N]
    mask = rollouts.completion_mask  # [N, T]
    with torch.no_grad():
        old = batched_logprobs(split.model, batch, 1.0, 4)  # [N, T] the sampling policy (no update yet)
        ref = split.learner.reference_logprobs(batch)
    tokens = mask.sum()
    before = [p.detach().clone() for p in split.model.parameters()]
    split.learner.update(batch, advantages, mask, ref, old_logprobs=old, num_items_in_batch=tokens)
    for rows in (slice(0, 4), slice(4, 8)):
        whole.learner.update(
            batch.rows(rows),
            advantages[rows],
            mask[rows],
            ref[rows],
            old_logprobs=old[rows],
            num_items_in_batch=tokens / 2,
        )
    for (name, p), q in zip(split.model.named_parameters(), whole.model.parameters()):
        torch.testing.assert_close(p, q, atol=1e-6, rtol=0, msg=name)
    assert any(not torch.equal(p, b) for p, b in zip(split.model.parameters(), before))  # the updates moved it


def metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_resume_with_mini_batches_equals_a_straight_run(tiny_model_dir, tmp_path):
    """Checkpoints come at generation boundaries (a step is one generation batch): 2 steps + resume + 2 steps = 4."""
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    trainer(tiny_model_dir, config(straight, max_steps=4, num_mini_batches=2)).train()
    trainer(tiny_model_dir, config(resumed, max_steps=2, num_mini_batches=2)).train()
    trainer(tiny_model_dir, config(resumed, max_steps=4, num_mini_batches=2, resume_from="latest")).train()
    a, b = metrics(straight), metrics(resumed)
    assert [m["step"] for m in a] == [m["step"] for m in b] == [1, 2, 3, 4]
    for x, y in zip(a, b):
        for key in ("loss", "kl", "grad_norm", "reward", "learning_rate"):
            assert x[key] == pytest.approx(y[key], abs=1e-6), (x["step"], key)
    wa, wb = load_file(straight / "final" / "model.safetensors"), load_file(resumed / "final" / "model.safetensors")
    for name in wa:
        torch.testing.assert_close(wa[name], wb[name], atol=1e-6, rtol=0)
