"""Evaluation beside the loop: sample each eval set's prompts, score them, and name the metrics (grpokit's
``eval/...``; transformers' timings apart), with TRL's evaluation loss of the samples."""

from __future__ import annotations

from grpokit.algos.algorithms import AdvantageInputs
from grpokit.train.experience.scoring import reward_state
from grpokit.train.learning.learner import update_inputs
from grpokit.train.learning.policy_logprobs import build_batch
from grpokit.train.metrics import EVAL, sample_metrics, stored_eval_names, trl_eval_names


def evaluations(run, sets: dict, step: int) -> dict:
    """{eval set name (None: the one eval_dataset): (its metrics under grpokit's names (``eval/...``), the
    evaluation's timings: transformers' runtime, samples_per_second, steps_per_second, each prompt's result:
    ``Evaluation.per_prompt``)} of ``sets`` ({name:
    (PromptSource, rows)}) after ``step`` steps of ``run``."""
    state = reward_state(run.train_source, run.spec.max_steps, step + 1)
    results = {}
    for name, (source, rows) in sets.items():
        found = run.evaluator(source, rows, trainer_state=state)
        sampled = sample_metrics(found.rewards, found.num_samples, found.lengths, found.truncated)
        seconds = found.seconds
        metrics = {
            **{EVAL + k: v for k, v in sampled.items()},
            **{EVAL + k: v for k, v in evaluation_loss(run, found).items()},
            **found.metrics,
        }
        speed = {
            EVAL + "runtime": round(seconds, 4),
            EVAL + "samples_per_second": round(found.lengths.numel() / seconds, 3) if seconds else 0.0,
            EVAL + "steps_per_second": round(found.batches / seconds, 3) if seconds else 0.0,
        }
        results[name] = (metrics, speed, found.per_prompt)
    return results


def evaluation_loss(run, found) -> dict[str, float]:
    """TRL's evaluation loss of an evaluation's samples (``found``, an ``Evaluation``): each batch's advantages from
    its rewards (groups of num_generations_eval), then ``Learner.evaluation_loss``; the metrics (``loss``,
    ``entropy``, ``kl``, clip ratios) averaged over the batches, as TRL averages its eval batches. Not for an
    algorithm with a critic, nor across processes (the forward runs on rank 0 alone): {} then."""
    if run.algorithm.uses_critic or run.procs.enabled or not found.samples:
        return {}
    per_batch = []
    for rollouts, rewards in found.samples:
        loss_mask = update_inputs(run.update_inputs_spec, rollouts, run.device).loss_mask
        n = rollouts.completion_ids.size(0)
        advantages = run.algorithm.advantages(
            AdvantageInputs(rewards, rollouts.num_generations, slice(0, n), loss_mask, beta=0.0), run.spec.algo
        )
        batch = build_batch(run.model, rollouts, run.tokenizer.pad_token_id, run.device)
        per_batch.append(run.learner.evaluation_loss(batch, advantages.advantages, loss_mask))
    return {key: sum(m[key] for m in per_batch) / len(per_batch) for key in per_batch[0]}


def log_evaluations(run, sets: dict, step: int, prefix: str = "eval", run_log=None) -> dict:
    """Evaluate ``sets`` ({name: (PromptSource, rows)}) after ``step`` steps: each set's metrics are a log entry
    (TRL's names, ``prefix`` for ``eval``) and reach the callbacks' ``on_evaluate``; ``run_log`` (during training)
    keeps them under grpokit's names (not the timings: a resume reproduces every number it holds). Returns every
    set's TRL-named metrics."""
    out: dict[str, float] = {}
    for name, (metrics, speed, per_prompt) in evaluations(run, sets, step).items():
        if run_log is not None:
            run_log.evaluation(step, stored_eval_names(metrics, name), "eval" if name is None else name, per_prompt)
        logged = trl_eval_names(metrics | speed, prefix if name is None else f"{prefix}_{name}")
        run.callbacks.log(logged)
        run.callbacks.event("on_evaluate", metrics=logged)
        out |= logged
    return out
