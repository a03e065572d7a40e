"""Evaluation: n samples per held-out prompt, mean reward, unbiased pass@k, and greedy accuracy."""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

import torch

from grpokit.algos import pass_at_k
from grpokit.data.prompts import reward_arguments
from grpokit.rollout.types import SamplingParams


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
) -> dict[str, float]:
    """Metrics ``eval/reward``, ``eval/pass@k`` for each k, ``eval/greedy_accuracy``, and
    ``eval/<name>`` for each name the reward functions logged with ``log_metric`` (the mean).

    The rewards are called as in training (:mod:`grpokit.rewards.contract`), with ``trainer_state``.
    ``tools``: the run's ``ToolRollouts`` (grpokit.train.tool_rollouts): samples are multi-turn tool rollouts,
    scored as in training.

    A sample is correct when its combined reward >= ``success_threshold``; pass@k per prompt is the
    unbiased estimator over its n samples (Chen et al. 2021), averaged over prompts.
    """
    indices = [int(i) for i in source.usable][:max_prompts]
    rewards, correct, greedy_correct = [], [], []
    logged: dict[str, list[float]] = {}
    score = functools.partial(
        _score,
        engine,
        tokenizer,
        source,
        rows,
        reward_runner,
        prompt_column=prompt_column,
        trainer_state=trainer_state,
        logged=logged,
        tools=tools,
    )
    for start in range(0, len(indices), prompts_per_batch):
        chunk = indices[start : start + prompts_per_batch]
        sampled = score(chunk, num_samples, params)
        rewards.append(sampled)
        correct.append((sampled.nan_to_num(float("-inf")) >= success_threshold).view(len(chunk), num_samples).sum(1))
        greedy = SamplingParams(params.max_completion_length, greedy=True)
        g = score(chunk, 1, greedy)
        greedy_correct.append(g.nan_to_num(float("-inf")) >= success_threshold)
    rewards_all = torch.cat(rewards)  # [P*n]
    correct_all = torch.cat(correct)  # [P]
    metrics = {"eval/reward": float(rewards_all.nanmean()), "eval/num_prompts": float(len(indices))}
    for k in ks:
        metrics[f"eval/pass@{k}"] = sum(pass_at_k(num_samples, int(c), k) for c in correct_all) / len(indices)
    metrics["eval/greedy_accuracy"] = float(torch.cat(greedy_correct).float().mean())
    metrics.update({f"eval/{name}": sum(values) / len(values) for name, values in logged.items()})
    return metrics


@dataclass(frozen=True)
class EvalSpec:
    """A run's evaluation settings: ``num_generations_eval`` samples per prompt, the ``pass_at_k`` values,
    ``temperature`` (eval_temperature, else the sampling temperature), ``success_threshold``, the dataset's
    ``prompt_column`` and ``max_eval_prompts`` (None: all)."""

    num_generations_eval: int = 8
    pass_at_k: tuple = (1, 8)
    temperature: float = 1.0
    success_threshold: float = 1.0
    prompt_column: str = "prompt"
    max_eval_prompts: int | None = None


class Evaluator:
    """A run's evaluation: :func:`evaluate` on its eval prompts (``source``, a PromptSource, and their ``rows``;
    None without an eval set) with its engine, rewards and settings (an :class:`EvalSpec`); ``tools``: the run's
    ``ToolRollouts`` (multi-turn tool rollouts), or None."""

    def __init__(
        self,
        spec: EvalSpec,
        *,
        engine,
        tokenizer,
        source,
        rows: list[dict] | None,
        reward_runner,
        params: SamplingParams,
        tools=None,
    ):
        self.spec, self.engine, self.tokenizer, self.source, self.rows = spec, engine, tokenizer, source, rows
        self.reward_runner, self.params, self.tools = reward_runner, params, tools

    def __call__(self, trainer_state=None) -> dict[str, float]:
        if self.source is None:
            raise ValueError("evaluate() needs an eval_dataset (argument or data.eval_dataset).")
        spec = self.spec
        return evaluate(
            self.engine,
            self.tokenizer,
            self.source,
            self.rows,
            self.reward_runner,
            trainer_state=trainer_state,
            num_samples=spec.num_generations_eval,
            ks=list(spec.pass_at_k),
            params=dataclasses.replace(self.params, temperature=spec.temperature),
            success_threshold=spec.success_threshold,
            prompt_column=spec.prompt_column,
            max_prompts=spec.max_eval_prompts,
            tools=self.tools,
        )


def _score(
    engine, tokenizer, source, rows, reward_runner, chunk, n, params, *, prompt_column, trainer_state, logged, tools
) -> torch.Tensor:
    if tools is None:
        rollouts = engine.generate([source.ids[i] for i in chunk], n, params)
    else:
        rollouts = tools.generate([rows[i] for i in chunk], n, params)
    prompts, texts, columns, ids = reward_arguments(rows, chunk, rollouts, tokenizer, prompt_column)
    if tools is not None:
        prompts, texts, columns = tools.reward_inputs(prompts, rollouts.conversations, columns)
    result = reward_runner.score(prompts, texts, columns, group_size=n, completion_ids=ids, trainer_state=trainer_state)
    for name, values in result.logged.items():
        logged.setdefault(name, []).extend(values)
    return result.combined  # [len(chunk) * n]
