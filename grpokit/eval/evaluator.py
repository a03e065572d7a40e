"""Evaluation: n samples per held-out prompt, their rewards and lengths, unbiased pass@k, and greedy accuracy."""

from __future__ import annotations

import dataclasses
import functools
import json
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from grpokit.algos import pass_at_k
from grpokit.data.prompts import reward_arguments
from grpokit.rewards.runner import RewardResult
from grpokit.rollout.types import SamplingParams
from grpokit.store.record import prompt_images

if TYPE_CHECKING:
    from grpokit.data.settings import PromptSettings
    from grpokit.eval.settings import EvalSettings


@dataclass
class Evaluation:
    """One evaluation of an eval set: the ``num_samples`` sampled completions of each prompt, their ``rewards`` (one
    ``RewardResult`` over all of them, prompt by prompt), ``lengths`` [P*n] (tokens the model wrote) and
    ``truncated`` [P*n] (1.0 where a completion hit max_completion_length); ``metrics``: ``eval/pass@k`` for each k,
    ``eval/greedy_accuracy``, ``eval/num_prompts``; ``seconds`` it took, in ``batches`` batches of prompts;
    ``samples``: each batch's sampled ``Rollouts`` and their combined rewards (the trainer's evaluation loss reads
    them); ``per_prompt``: each prompt's result (prompt_index, prompt, correct: samples at or above the success
    threshold, samples, mean_reward; a prompt with images: their hashes ``images`` and the images
    ``image_sources``), which the store keeps for the report's held-out view. The names of the reward
    and length metrics are the trainer's (``grpokit.train.metrics``)."""

    rewards: RewardResult
    lengths: torch.Tensor
    truncated: torch.Tensor
    num_samples: int
    metrics: dict[str, float]
    seconds: float
    batches: int
    samples: list = field(default_factory=list)
    per_prompt: list = field(default_factory=list)


def evaluate(
    engine,
    tokenizer,
    source,
    rows: list[dict],
    reward_runner,
    *,
    num_samples: int,
    ks: list[int],
    params: SamplingParams,
    success_threshold: float,
    prompt_column: str = "prompt",
    prompts_per_batch: int = 16,
    max_prompts: int | None = None,
    trainer_state=None,
    tools=None,
) -> Evaluation:
    """Sample ``num_samples`` completions of each eval prompt with ``params`` and one greedily (the same ``params``:
    repetition penalty and suppressed tokens apply), and score them. An engine that takes raw prompts (a
    rollout_func, which samples as it likes) gets no greedy pass: no ``eval/greedy_accuracy`` then.

    The rewards are called as in training (:mod:`grpokit.rewards.contract`), with ``trainer_state``.
    ``tools``: the run's ``ToolRollouts`` (grpokit.train.experience.tool_rollouts): samples are multi-turn tool
    rollouts, scored as in training.

    A sample is correct when its combined reward >= ``success_threshold``; pass@k per prompt is the
    unbiased estimator over its n samples (Chen et al. 2021), averaged over prompts.
    """
    started = time.perf_counter()
    indices = [int(i) for i in source.usable][:max_prompts]
    sampled, correct, greedy_correct, lengths, truncated, samples, means = [], [], [], [], [], [], []
    score = functools.partial(
        _score,
        engine,
        tokenizer,
        source,
        rows,
        reward_runner,
        prompt_column=prompt_column,
        trainer_state=trainer_state,
        tools=tools,
    )
    greedy = dataclasses.replace(params, greedy=True)
    for start in range(0, len(indices), prompts_per_batch):
        chunk = indices[start : start + prompts_per_batch]
        result, rollouts = score(chunk, num_samples, params)
        sampled.append(result)
        samples.append((rollouts, result.combined))
        lengths.append(rollouts.sampled_lengths.float())
        truncated.append(rollouts.truncated.float())
        correct.append(
            (result.combined.nan_to_num(float("-inf")) >= success_threshold).view(len(chunk), num_samples).sum(1)
        )
        means.append(result.combined.view(len(chunk), num_samples).nanmean(1))
        if not engine.takes_raw_prompts:  # a rollout_func samples as it likes: it has no greedy decoding to ask for
            g, _ = score(chunk, 1, greedy)
            greedy_correct.append(g.combined.nan_to_num(float("-inf")) >= success_threshold)
    correct_all = torch.cat(correct)  # [P]
    metrics = {"eval/num_prompts": float(len(indices))}
    for k in ks:
        metrics[f"eval/pass@{k}"] = sum(pass_at_k(num_samples, int(c), k) for c in correct_all) / len(indices)
    if greedy_correct:
        metrics["eval/greedy_accuracy"] = float(torch.cat(greedy_correct).float().mean())
    return Evaluation(
        rewards=concat_results(sampled),
        lengths=torch.cat(lengths),
        truncated=torch.cat(truncated),
        num_samples=num_samples,
        metrics=metrics,
        seconds=time.perf_counter() - started,
        batches=len(sampled),
        samples=samples,
        per_prompt=_per_prompt(indices, rows, prompt_column, correct_all, torch.cat(means), num_samples, source),
    )


def _per_prompt(indices, rows, prompt_column, correct, means, num_samples, source) -> list[dict]:
    """Each evaluated prompt's result: its dataset row index, its prompt as the dataset holds it (chat messages as
    JSON), the count of its ``num_samples`` samples counted correct, its mean combined reward (NaN: none), and its
    images as a training rollout's record has them (``store.record.prompt_images`` of its token ids)."""
    out = []
    for i, c, m in zip(indices, correct.tolist(), means.tolist()):
        prompt = rows[i][prompt_column]
        text = prompt if isinstance(prompt, str) else json.dumps(prompt, ensure_ascii=False, default=str)
        result = {"prompt_index": i, "prompt": text, "correct": int(c), "samples": num_samples, "mean_reward": m}
        out.append(result | prompt_images(source.ids[i]))
    return out


def concat_results(results: list[RewardResult]) -> RewardResult:
    """One RewardResult of consecutive batches' (the same functions): rows in order, error counts added, logged
    values and extra columns joined."""
    first = results[0]
    logged: dict[str, list[float]] = {}
    extra: dict[str, list] = {}
    for r in results:
        for name, values in r.logged.items():
            logged.setdefault(name, []).extend(values)
        for name, values in r.extra.items():
            extra.setdefault(name, []).extend(values)
    return RewardResult(
        names=list(first.names),
        per_func=torch.cat([r.per_func for r in results]),
        combined=torch.cat([r.combined for r in results]),
        errors=[e for r in results for e in r.errors],
        error_counts={name: sum(r.error_counts[name] for r in results) for name in first.names},
        logged=logged,
        extra=extra,
    )


class Evaluator:
    """A run's evaluation: :func:`evaluate` of an eval set (a PromptSource and its rows) with the run's engine,
    rewards and settings (``settings``; ``prompts``: the dataset's ``prompt_column``); ``params``: the run's
    SamplingParams (every sampling option as in training, the temperature eval_temperature when set); ``tools``: the
    run's ``ToolRollouts`` (multi-turn tool rollouts), or None."""

    def __init__(
        self,
        settings: EvalSettings,
        prompts: PromptSettings,
        *,
        engine,
        tokenizer,
        reward_runner,
        params: SamplingParams,
        tools=None,
    ):
        self.settings, self.prompt_column, self.engine, self.tokenizer = (
            settings,
            prompts.prompt_column,
            engine,
            tokenizer,
        )
        self.reward_runner, self.params, self.tools = reward_runner, params, tools

    def __call__(self, source, rows: list[dict], trainer_state=None) -> Evaluation:
        settings = self.settings
        return evaluate(
            self.engine,
            self.tokenizer,
            source,
            rows,
            self.reward_runner,
            trainer_state=trainer_state,
            num_samples=settings.num_generations_eval,
            ks=list(settings.pass_at_k),
            params=dataclasses.replace(self.params, temperature=settings.eval_temperature or self.params.temperature),
            success_threshold=settings.success_threshold,
            prompt_column=self.prompt_column,
            max_prompts=settings.max_eval_prompts,
            tools=self.tools,
        )


def _score(
    engine, tokenizer, source, rows, reward_runner, chunk, n, params, *, prompt_column, trainer_state, tools
) -> tuple[RewardResult, object]:
    """(RewardResult, Rollouts) of ``n`` samples of each prompt of ``chunk``."""
    if tools is None:
        raw = engine.takes_raw_prompts  # a rollout_func: the prompts as the dataset holds them
        rollouts = engine.generate([rows[i][prompt_column] if raw else source.ids[i] for i in chunk], n, params)
    else:
        rollouts = tools.generate([rows[i] for i in chunk], n, params)
    prompts, texts, columns, ids = reward_arguments(rows, chunk, rollouts, tokenizer, prompt_column)
    if tools is not None:
        prompts, texts, columns = tools.reward_inputs(prompts, rollouts.conversations, columns)
    result = reward_runner.score(prompts, texts, columns, group_size=n, completion_ids=ids, trainer_state=trainer_state)
    return result, rollouts
