"""DAPO's dynamic sampling inside one training step (Yu et al. 2025, section 3.2), in one process.

A round samples a batch of prompts and scores it. Groups whose rewards all tie (zero advantage) are dropped, and
rounds follow until the step has its batch of informative groups or ``max_sampling_rounds`` rounds were sampled.
At the cap the step trains on the informative groups it found (the largest multiple of ``num_mini_batches`` of them,
so every mini-batch gets whole groups); with none, the step makes no update. Which groups are kept is
``algos.dynamic_sampling`` (pure); this module runs the rounds and joins their data. Every sampled group goes to
the store, the dropped ones with no advantage (``None``: not trained on).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from grpokit.algos.dynamic_sampling import SamplingRounds, add_round
from grpokit.algos.names import SAMPLING_GROUPS_TRAINED, SAMPLING_PROMPTS, SAMPLING_ROUNDS, SAMPLING_SHORT
from grpokit.rewards.runner import RewardResult
from grpokit.rollout.seeding import concat_rollouts
from grpokit.rollout.types import Rollouts


@dataclass
class Sampled:
    """Scored groups: the prompt index of each group, their Rollouts (G per prompt), decoded completions [N] and
    RewardResult."""

    indices: list[int]
    rollouts: Rollouts
    completions: list[str]
    reward: RewardResult


@dataclass
class StepRounds:
    """A step's rounds: ``sampled`` every round joined in order; ``train_rows`` long [k*G], the rows of ``sampled``
    to train on (whole informative groups, in sampling order); ``metrics`` the rounds, prompts and groups."""

    sampled: Sampled
    train_rows: torch.Tensor
    metrics: dict[str, float]


def sample_rounds(
    first: Sampled,
    next_round: Callable[[int], Sampled],
    target_groups: int,
    max_rounds: int,
    num_generations: int,
    num_mini_batches: int,
    pad_token_id: int,
) -> StepRounds:
    """Add rounds after ``first`` (``next_round(r)`` samples and scores round r >= 1) until ``target_groups``
    informative groups are found or ``max_rounds`` rounds were sampled."""
    G = num_generations
    state = add_round(SamplingRounds(target_groups, max_rounds), first.reward.combined, G)
    rounds = [first]
    while not state.done:
        rounds.append(next_round(state.rounds))
        state = add_round(state, rounds[-1].reward.combined, G)
    starts = torch.tensor([0] + [len(r.completions) for r in rounds]).cumsum(0)  # [R + 1] first row of each round
    rows = torch.cat([state.rows(r, G) + starts[r] for r in range(len(rounds))])  # [kept * G]
    groups = len(state.kept) - len(state.kept) % num_mini_batches  # whole groups in every mini-batch
    metrics = {
        SAMPLING_ROUNDS: float(state.rounds),
        SAMPLING_PROMPTS: float(state.groups_seen),
        SAMPLING_GROUPS_TRAINED: float(groups),
        SAMPLING_SHORT: float(state.short),
    }
    return StepRounds(join(rounds, pad_token_id), rows[: groups * G], metrics)


def join(rounds: list[Sampled], pad_token_id: int) -> Sampled:
    """The rounds as one batch, in order (one round: itself)."""
    if len(rounds) == 1:
        return rounds[0]
    return Sampled(
        [i for r in rounds for i in r.indices],
        concat_rollouts([r.rollouts for r in rounds], pad_token_id),
        [c for r in rounds for c in r.completions],
        join_rewards([r.reward for r in rounds]),
    )


def join_rewards(results: list[RewardResult]) -> RewardResult:
    """RewardResults of the same functions on consecutive completions as one: rows in order, error counts added,
    logged values pooled, ``log_extra`` columns None on the rows of a part that did not log them."""
    sizes = [len(r.errors) for r in results]
    columns = dict.fromkeys(c for r in results for c in r.extra)
    logged = dict.fromkeys(name for r in results for name in r.logged)
    return RewardResult(
        names=results[0].names,
        per_func=torch.cat([r.per_func for r in results]),  # [N, F]
        combined=torch.cat([r.combined for r in results]),  # [N]
        errors=[e for r in results for e in r.errors],
        error_counts={name: sum(r.error_counts[name] for r in results) for name in results[0].names},
        logged={name: [v for r in results for v in r.logged.get(name, [])] for name in logged},
        extra={c: [v for r, n in zip(results, sizes) for v in r.extra.get(c, [None] * n)] for c in columns},
    )


def take_rows(rollouts: Rollouts, rows: torch.Tensor) -> Rollouts:
    """The completions at ``rows`` (long [k*G], whole groups in order) as Rollouts of their k prompts."""
    G = rollouts.num_generations
    picked = rows.tolist()
    return replace(
        rollouts,
        prompt_ids=[rollouts.prompt_ids[n // G] for n in picked[::G]],
        completion_ids=rollouts.completion_ids[rows],  # [k*G, T]
        completion_mask=rollouts.completion_mask[rows],  # [k*G, T]
        logprobs=rollouts.logprobs[rows],  # [k*G, T]
        finish_reasons=[rollouts.finish_reasons[n] for n in picked],
        loss_mask=None if rollouts.loss_mask is None else rollouts.loss_mask[rows],  # [k*G, T]
        conversations=None if rollouts.conversations is None else [rollouts.conversations[n] for n in picked],
    )


def stored_advantages(advantages: torch.Tensor, train_rows: torch.Tensor, size: int) -> torch.Tensor:
    """[size] advantages of every sampled completion for the store: the trained rows' ``advantages`` [k*G], NaN
    (stored as None: not trained on) elsewhere."""
    out = torch.full((size,), float("nan"))
    out[train_rows] = advantages.float().cpu()
    return out


def renumber_repeats(records: list, num_generations: int) -> list:
    """Records of a step in which a prompt may have been drawn again by a later round (the data wrapped into a new
    epoch): the completions of its k-th group get completion_index k*G + g, so (step, prompt, completion) stays
    unique in the store."""
    seen: dict[int, int] = {}
    out = []
    for n, record in enumerate(records):
        if n % num_generations == 0:
            repeat = seen.get(record.prompt_index, 0)
            seen[record.prompt_index] = repeat + 1
        index = repeat * num_generations + record.completion_index
        out.append(replace(record, completion_index=index) if repeat else record)
    return out
