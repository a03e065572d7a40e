"""Evaluation: n samples per held-out prompt, mean reward, unbiased pass@k, and greedy accuracy."""

from __future__ import annotations

import torch

from grpokit.algos import pass_at_k
from grpokit.data.prompts import reward_inputs
from grpokit.modeling import decode
from grpokit.rollout.types import SamplingParams


def evaluate(engine, tokenizer, source, rows: list[dict], reward_runner, *, num_samples: int, ks: list[int],
             params: SamplingParams, success_threshold: float, prompt_column: str = "prompt",
             prompts_per_batch: int = 16, max_prompts: int | None = None) -> dict[str, float]:
    """Metrics ``eval/reward``, ``eval/pass@k`` for each k, ``eval/greedy_accuracy``.

    A sample is correct when its combined reward >= ``success_threshold``; pass@k per prompt is the
    unbiased estimator over its n samples (Chen et al. 2021), averaged over prompts.
    """
    indices = [int(i) for i in source.usable][:max_prompts]
    rewards, correct, greedy_correct = [], [], []
    for start in range(0, len(indices), prompts_per_batch):
        chunk = indices[start : start + prompts_per_batch]
        sampled = _score(engine, tokenizer, source, rows, reward_runner, chunk, num_samples, params, prompt_column)
        rewards.append(sampled)
        correct.append((sampled.nan_to_num(float("-inf")) >= success_threshold).view(len(chunk), num_samples).sum(1))
        greedy = SamplingParams(params.max_completion_length, greedy=True)
        g = _score(engine, tokenizer, source, rows, reward_runner, chunk, 1, greedy, prompt_column)
        greedy_correct.append(g.nan_to_num(float("-inf")) >= success_threshold)
    rewards_all = torch.cat(rewards)  # [P*n]
    correct_all = torch.cat(correct)  # [P]
    metrics = {"eval/reward": float(rewards_all.nanmean()), "eval/num_prompts": float(len(indices))}
    for k in ks:
        metrics[f"eval/pass@{k}"] = sum(pass_at_k(num_samples, int(c), k) for c in correct_all) / len(indices)
    metrics["eval/greedy_accuracy"] = float(torch.cat(greedy_correct).float().mean())
    return metrics


def _score(engine, tokenizer, source, rows, reward_runner, chunk, n, params, prompt_column) -> torch.Tensor:
    rollouts = engine.generate([source.ids[i] for i in chunk], n, params)
    texts = [decode(tokenizer, ids[: int(length)].tolist()) for ids, length in zip(rollouts.completion_ids, rollouts.completion_lengths)]
    prompts = [source.texts[i] for i in chunk for _ in range(n)]
    columns = reward_inputs(rows, chunk, n, prompt_column, rollouts.completion_lengths.tolist())
    return reward_runner.score(prompts, texts, columns, group_size=n).combined  # [len(chunk) * n]
