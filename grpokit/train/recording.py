"""Recording a step: its metrics (every process's numbers, gathered) and its rollouts as the store keeps them."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from grpokit.algos.dynamic_sampling import zero_variance_counts
from grpokit.machine.peak_memory import step_memory
from grpokit.store.record import rollout_records
from grpokit.train.experience.rounds import renumber_repeats
from grpokit.train.metrics import PhaseClock, step_metrics, token_staleness_sums
from grpokit.train.teacher.record import attach_teacher_logprobs
from grpokit.train.token_record import attach_token_values


@dataclass(frozen=True)
class StepRecord:
    """A step's ``values`` (its metrics.jsonl line) and, on rank 0, every process's rollout ``records``."""

    values: dict
    records: list


def zero_variance(sampled, G: int) -> dict[str, float]:
    """``curriculum/*`` of the groups whose rewards all tie (zero advantage): how many were sampled (every round),
    how many were kept in the batch trained on (none when dynamic sampling drops them), and ``learned_nothing`` 1.0 when
    the step trained on no group with a reward spread (every group solved or every one failed: no update)."""
    groups, tied, kept = zero_variance_counts(sampled.global_rewards.combined, G, sampled.train_rows)
    trained = groups if sampled.train_rows is None else sampled.train_rows.numel() // G
    return {
        "curriculum/zero_variance_groups": float(tied),
        "curriculum/zero_variance_fraction": tied / max(groups, 1),
        "curriculum/zero_variance_trained": float(kept),
        "curriculum/learned_nothing": float(trained - kept == 0),
    }


def step_record(run, step: int, sampled, advantages: torch.Tensor, update: dict, clock: PhaseClock, staleness: int):
    """The metrics of step ``step`` of ``run`` (``sampled``: its Trajectory; ``advantages``: this rank's, of the rows
    trained on; ``update``: the learner's metrics) and its rollout records; counts TRL's num_input_tokens_seen."""
    procs, source, G = run.procs, run.train_source, run.spec.num_generations
    rollouts = sampled.rollouts
    all_lengths = procs.gather(rollouts.sampled_lengths.float())  # [N_global] tokens the model wrote
    prompt_tokens = procs.sum(torch.tensor(float(sum(len(source.ids[i]) for i in sampled.indices) * G)))
    state = run.callbacks.state
    state.num_input_tokens_seen += int(prompt_tokens.item() + all_lengths.sum().item())  # TRL's num_tokens
    values = step_metrics(
        sampled.global_rewards,
        update=update,
        advantages=procs.gather(advantages.float()),  # [N_global trained], one per completion
        group_size=G,
        lengths=all_lengths,
        truncated=procs.gather(rollouts.truncated.float()),  # [N_global]
        prompt_tokens=prompt_tokens.item(),
        source=source,
        staleness=staleness,
        times=clock.metrics(),
        extra=run.rollout_scheduler.metrics()
        | step_memory(run.device)
        | source.curriculum_metrics()
        | zero_variance(sampled, G),
        tokens_seen=state.num_input_tokens_seen,
    )
    tokens = procs.sum(token_staleness_sums(rollouts, staleness))  # [2] every process's
    values["policy_staleness_token_mean"] = float(tokens[0] / tokens[1].clamp(min=1.0))
    stored = sampled.stored_advantages(advantages)  # every sampled group, the dropped ones without an advantage
    records = rollout_records(sampled.indices, rollouts, sampled.completions, sampled.reward, stored, source)
    attach_token_values(records, sampled, run.learner.take_token_values(), run.spec.token_values, run.tokenizer)
    attach_teacher_logprobs(records, sampled, run.distiller)  # on-policy distillation's teacher, float32 per token
    if sampled.train_rows is not None:  # a prompt drawn again by a later round: its completions numbered on
        records = renumber_repeats(records, G)
    records = procs.gather_objects(records)  # every rank's, on rank 0
    return StepRecord(values, [r for part in records for r in part] if procs.is_main else [])
