"""Learner.update in chunks of backward_chunk_rows rows per forward and backward pass: the same gradients, loss and
metrics as the whole micro-batch at once, for every loss type (each aggregation); and the rows chosen when a run does
not fit in memory."""

from __future__ import annotations

import copy

import pytest
import torch
from shared_helpers import sampled_batch, tiny_args

from grpokit.algos.loss_registry import loss_types
from grpokit.compose.memory import backward_chunk_rows, pass_sizes
from grpokit.compose.specs import learner_spec
from grpokit.config import ConfigError, GRPOConfig
from grpokit.train.learning.learner import Learner
from grpokit.train.learning.reference import Reference

pytestmark = pytest.mark.usefixtures("one_thread")
CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def sampled():
    return sampled_batch(4, max_completion_length=7, seed=5, num_layers=2)


class RecordingSGD(torch.optim.SGD):
    """SGD at learning rate 0 that keeps each step's gradients (the weights stay as they are)."""

    def step(self, closure=None):
        self.grads = [p.grad.clone() for group in self.param_groups for p in group["params"]]
        return super().step(closure)


def update(model, batch, rollouts, chunk_rows, **settings):
    settings = dict(beta=0.05, epsilon=0.05, backward_chunk_rows=chunk_rows) | settings
    cfg = tiny_args(num_generations=4, prompts_per_step=1, max_completion_length=7, **settings)
    policy = copy.deepcopy(model)
    optimizer = RecordingSGD(policy.parameters(), lr=0.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    learner = Learner(policy, Reference(model, use_adapters=False), optimizer, scheduler, learner_spec(cfg))
    mask = rollouts.completion_mask.float()
    advantages = torch.tensor([1.0, -0.5, 0.25, -0.75, 0.5, 1.5, -1.0, -1.0])
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        ref = learner.reference_logprobs(batch)
        # an older policy 0.1 away, so ratios move off 1 and some tokens clip
        old = learner.old_logprobs(batch) + 0.1 * torch.randn(mask.shape, generator=generator)
    metrics = learner.update(batch, advantages, mask, ref, old_logprobs=old)
    return metrics, optimizer.grads


@pytest.mark.parametrize("loss_type", loss_types())
@pytest.mark.parametrize("level", ["token", "sequence"])
def test_chunks_give_the_micro_batchs_numbers(sampled, loss_type, level):
    """Micro-batches of 4 rows in chunks of 1, 2 and 3 rows (3: uneven) against each micro-batch at once."""
    model, rollouts, batch = sampled
    settings = {"loss_type": loss_type, "importance_sampling_level": level}
    if loss_type == "cispo":
        settings["epsilon_high"] = 1.05
    whole, grads = update(model, batch, rollouts, None, **settings)
    assert abs(whole["ratio_mean"] - 1.0) > 1e-3  # off-policy: the ratios moved off 1
    for rows in (1, 2, 3):
        chunked, chunked_grads = update(model, batch, rollouts, rows, **settings)
        for a, b in zip(grads, chunked_grads):
            torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-7)
        assert chunked.keys() == whole.keys()
        for key, value in whole.items():
            if not key.startswith("time/"):
                assert chunked[key] == pytest.approx(value, rel=1e-5, abs=1e-7), key


def test_backward_chunk_rows_by_hand():
    """The whole micro-batch when it fits; else the largest pass that fits: multiples of G = 8 below 32 (24, 16, 8),
    then divisors of 8 (4, 2, 1), none under 256 completion tokens (4 rows at 64 tokens)."""
    cfg = GRPOConfig(num_generations=8, per_device_train_batch_size=32, max_completion_length=64)
    assert pass_sizes(cfg) == [24, 16, 8, 4]
    assert pass_sizes(cfg.replace(max_completion_length=256)) == [24, 16, 8, 4, 2, 1]
    assert backward_chunk_rows(cfg, lambda rows: True) == 32
    assert backward_chunk_rows(cfg, lambda rows: rows <= 20) == 16
    assert backward_chunk_rows(cfg, lambda rows: rows <= 5) == 4
    assert backward_chunk_rows(cfg, lambda rows: False) == 4  # none fits: the smallest (the fit warning says so)
    assert backward_chunk_rows(cfg.replace(backward_chunk_rows=2), lambda rows: True) == 2  # as set
    # the entropy quantile needs the whole micro-batch's entropies: not chosen, and refused when set
    assert backward_chunk_rows(cfg.replace(top_entropy_quantile=0.2), lambda rows: False) == 32
    with pytest.raises(ConfigError, match="backward_chunk_rows=8 splits a micro-batch, but top_entropy_quantile"):
        cfg.replace(top_entropy_quantile=0.2, backward_chunk_rows=8)


def test_a_run_that_does_not_fit_gets_smaller_passes(monkeypatch):
    """update_chunk_rows against the memory free: Qwen2.5-0.5B's shape (meta device, float32, the lean MLP) needs
    ~13.1 GiB with one pass of 32 rows, ~11.4 GiB with passes of 16, ~10.7 GiB with passes of 8 (the estimate's saved
    activations: 3.6, 1.8 and 1.0 GB)."""
    import transformers

    from grpokit.compose import memory

    config = transformers.Qwen2Config(
        hidden_size=896,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        intermediate_size=4864,
        vocab_size=151936,
        tie_word_embeddings=True,
    )
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    shape = {"num_generations": 8, "per_device_train_batch_size": 32, "max_completion_length": 64}
    cfg = GRPOConfig(**shape, max_prompt_length=68, dtype="float32")
    monkeypatch.setattr(memory, "available_bytes", lambda device: 24 * 2**30)
    assert memory.update_chunk_rows(cfg, model, CPU) == 32
    monkeypatch.setattr(memory, "available_bytes", lambda device: 12 * 2**30)
    assert memory.update_chunk_rows(cfg, model, CPU) == 16
    assert memory.update_chunk_rows(cfg, model, CPU, processes=2) == 4  # two CPU processes share the 12 GiB
    monkeypatch.setattr(memory, "available_bytes", lambda device: 11 * 2**30)
    assert memory.update_chunk_rows(cfg, model, CPU) == 8
    monkeypatch.setattr(memory, "available_bytes", lambda device: None)  # unknown: as configured
    assert memory.update_chunk_rows(cfg, model, CPU) == 32
    # The trainer passes its longest prompt, which replaces max_prompt_length's bound in the estimate: at 12 GiB the
    # 512-token default (~15.1 GiB in one pass) would take passes of 8 for 68-token prompts, and no bound at all
    # (prompts counted as 0 tokens, ~12.2 GiB) passes of 24 that do not fit.
    monkeypatch.setattr(memory, "available_bytes", lambda device: 12 * 2**30)
    for bound, alone in ((512, 8), (None, 24)):
        bounded = cfg.replace(max_prompt_length=bound)
        assert memory.update_chunk_rows(bounded, model, CPU) == alone
        assert memory.update_chunk_rows(bounded, model, CPU, prompt_tokens=68) == 16
