"""The vLLM engine itself with the real vLLM (its CPU build): log-probs equal to the learner's after each sync
(tied head included), seeds, greedy groups, and the settings that reach vLLM (eager, KV cache, context, no
sleep mode on the CPU)."""

from __future__ import annotations

import gc

import pytest
import torch
from real_vllm_helpers import GAP_FP32, SETTINGS, TARGET_REWARD, prompts
from shared_helpers import sampling_params

from grpokit import GRPOConfig, GRPOTrainer
from grpokit.config import ConfigError
from grpokit.train.learning.policy_logprobs import batched_logprobs, build_batch


@pytest.fixture(scope="module")
def built(tmp_path_factory, vllm_model_dir):
    """A float32 trainer on vLLM, built with VLLM_CPU_KVCACHE_SPACE unset, so the config's KV cache applies."""
    mp = pytest.MonkeyPatch()
    mp.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    args = GRPOConfig(**{**SETTINGS, "output_dir": str(tmp_path_factory.mktemp("engine") / "run"), "dtype": "float32"})
    try:
        trainer = GRPOTrainer(str(vllm_model_dir), TARGET_REWARD, args=args, train_dataset=prompts())
    finally:
        mp.undo()
    yield trainer
    del trainer
    gc.collect()  # before another module builds its vLLM (conftest.one_vllm_at_a_time)


def gap(trainer, rollouts) -> float:
    """Mean |learner - vLLM| log-prob over the sampled tokens (sampling_is/logprob_abs_diff's measure)."""
    batch = build_batch(trainer.model, rollouts, trainer.tokenizer.pad_token_id, trainer.device)
    with torch.no_grad():
        learner = batched_logprobs(trainer.model, batch, 1.0, 8).cpu()
    mask = rollouts.completion_mask
    return float(((learner - rollouts.logprobs).abs() * mask).sum() / mask.sum())


def test_settings_reach_vllm_on_the_cpu(built):
    config = built.engine.llm.llm_engine.vllm_config
    assert built.engine.platform == "cpu" and built.engine.sleep_mode is False
    assert config.model_config.enforce_eager is True
    assert config.cache_config.kv_cache_memory_bytes == 2**28  # vllm_kv_cache_gib: 0.25
    # max_prompt_length 512 (default) + 8 on a 128-position model: capped at 128 instead of vLLM's error
    assert config.model_config.max_model_len == 128
    assert str(config.model_config.dtype) == "torch.float32"


def test_log_probs_equal_the_learners_after_each_sync_tied_head_included(built):
    engine, policy = built.engine, built.model
    assert policy.config.tie_word_embeddings
    params = sampling_params(8, temperature=1.0)
    first = engine.generate([[5, 6, 7], [8, 9]], 4, params)
    assert first.completion_ids.shape[0] == 8 and set(first.finish_reasons) <= {"stop", "length"}
    assert gap(built, first) <= GAP_FP32
    for version in (1, 2):  # new policy versions: vLLM must sample from the new weights, the tied head too
        with torch.no_grad():
            for p in policy.parameters():
                p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(version)))
        engine.sync_weights()
        rollouts = engine.generate([[5, 6, 7], [8, 9]], 4, params)
        assert rollouts.policy_version == version and gap(built, rollouts) <= GAP_FP32
    engine.generator.manual_seed(0)  # same seeds, same weights: the same rollouts
    a = engine.generate([[5, 6, 7]], 4, params)
    engine.generator.manual_seed(0)
    b = engine.generate([[5, 6, 7]], 4, params)
    assert torch.equal(a.completion_ids, b.completion_ids)


def test_greedy_with_several_samples_per_prompt(built):
    """vLLM refuses n > 1 at temperature 0: the engine sends n requests of 1, one group per prompt."""
    greedy = built.engine.generate([[5, 6, 7], [8, 9]], 3, sampling_params(6, greedy=True))
    assert greedy.completion_ids.shape[0] == 6 and greedy.group_index.tolist() == [0, 0, 0, 1, 1, 1]
    rows = greedy.completion_ids
    assert torch.equal(rows[0], rows[1]) and torch.equal(rows[0], rows[2]) and torch.equal(rows[3], rows[5])
    # the learner's argmax at every step: greedy log-probs are the top token's
    assert gap(built, greedy) <= GAP_FP32


def test_sleep_mode_asked_for_on_the_cpu_is_refused_in_one_line(tmp_path, vllm_model_dir):
    args = GRPOConfig(**{**SETTINGS, "output_dir": str(tmp_path / "run"), "vllm_enable_sleep_mode": True})
    with pytest.raises(ConfigError, match="vllm_enable_sleep_mode: true, but vLLM's CPU build has no sleep mode"):
        GRPOTrainer(str(vllm_model_dir), TARGET_REWARD, args=args, train_dataset=prompts())
