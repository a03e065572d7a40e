"""generation.engine: vllm with the real vLLM on a tiny saved model. Needs a CUDA GPU and `pip install vllm`;
skipped elsewhere (the pure parts and the error messages are tested in tests/unit/test_vllm_engine.py and
test_vllm_settings.py; vLLM's CPU build runs the engine in tests/real_vllm, `make test-vllm`)."""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch
from shared_helpers import TARGET_REWARD, WORDS, sampling_params, tiny_args, word_prompts

from grpokit import GRPOConfig, GRPOTrainer
from grpokit.testing import build_tiny_causal_lm, build_word_tokenizer
from grpokit.train.learning.policy_logprobs import batched_logprobs, build_batch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available() or importlib.util.find_spec("vllm") is None,
        reason="needs a CUDA GPU and the vllm package",
    ),
]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """head_dim 64, a size every vLLM attention backend supports."""
    path = tmp_path_factory.mktemp("tiny-vllm")
    build_tiny_causal_lm(path, build_word_tokenizer(WORDS), hidden_size=128, num_layers=2, num_heads=2)
    return path


def args(tmp_path, **overrides) -> GRPOConfig:
    vllm = dict(engine="vllm", device="cuda", dtype="float32", vllm_gpu_memory_utilization=0.2)
    run = dict(max_completion_length=8, learning_rate=1e-2, beta=0.04, save_steps=0)
    return tiny_args(tmp_path / "run", **(vllm | run | overrides))


def prompts():
    return word_prompts(20, 4)


def test_vllm_rollouts_match_the_learner_and_follow_weight_updates(tmp_path, model_dir):
    # vllm_dtype float32: on a GPU vLLM runs in bf16 by default, whatever the learner's dtype
    trainer = GRPOTrainer(
        str(model_dir), TARGET_REWARD, args=args(tmp_path, vllm_dtype="float32"), train_dataset=prompts()
    )
    engine, policy = trainer.engine, trainer.model
    params = sampling_params(8, temperature=1.0)

    def mismatch(rollouts) -> float:
        batch = build_batch(policy, rollouts, trainer.tokenizer.pad_token_id, trainer.device)
        with torch.no_grad():
            learner = batched_logprobs(policy, batch, 1.0, 8).cpu()
        mask = rollouts.completion_mask
        return float(((learner - rollouts.logprobs).abs() * mask).sum() / mask.sum())

    first = engine.generate([[5, 6, 7], [8, 9]], 4, params)
    assert first.completion_ids.shape[0] == 8 and set(first.finish_reasons) <= {"stop", "length"}
    assert mismatch(first) < 1e-3  # float32 on both sides: the same distribution
    with torch.no_grad():  # a new policy version: vLLM must sample from the new weights
        for p in policy.parameters():
            p.add_(0.05 * torch.randn_like(p))
    engine.policy_version += 1
    second = engine.generate([[5, 6, 7], [8, 9]], 4, params)
    assert second.policy_version == 1 and mismatch(second) < 1e-3
    # same seeds, same weights: the same rollouts
    engine.generator.manual_seed(0)
    a = engine.generate([[5, 6, 7]], 4, params)
    engine.generator.manual_seed(0)
    b = engine.generate([[5, 6, 7]], 4, params)
    assert torch.equal(a.completion_ids, b.completion_ids)


@pytest.mark.parametrize("lora", [False, True])
def test_train_with_vllm_end_to_end(tmp_path, model_dir, lora):
    extra = dict(lora={"r": 8}) if lora else {}
    trainer = GRPOTrainer(
        str(model_dir), TARGET_REWARD, args=args(tmp_path, dtype="bfloat16", **extra), train_dataset=prompts()
    )
    trainer.train()
    metrics = next(h for h in reversed(trainer.state.log_history) if "grad_norm" in h)  # the last step's
    assert torch.isfinite(torch.tensor(metrics["loss"]))
    logged = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    lines = [line for line in logged if "loss" in line]  # training steps
    assert len(lines) == 2
    for line in lines:  # bf16 vLLM against the learner: weights near 1, a small log-prob mismatch
        assert 0.5 < line["sampling_is/weight_mean"] < 1.5 and line["sampling_is/logprob_abs_diff"] < 0.5
    assert (tmp_path / "run" / "final").is_dir()
