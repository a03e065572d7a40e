"""Rollouts that do not depend on how prompts are split over processes or workers.

A single sampler stream makes a completion depend on every row sampled before it, so splitting a
batch differently (2 processes instead of 1, 3 Ray workers instead of 2, a chunk re-run after a
worker died) would change the rollouts. Instead, each group (the G completions of one prompt) is
sampled by its own generator seeded from (seed, step, group index in the step's global batch).
The same step then yields the same rollouts whatever the split, and a re-queued group is
regenerated identically. The price: each group is decoded as its own batch of G rows.
"""

from __future__ import annotations

import torch

from grpokit.rollout.types import Rollouts, SamplingParams

_PRIME = 1_000_003


_SPREAD = 1 << 16  # group seeds lie this far apart: the G samples of a group take seed + i (i < G <= _SPREAD)


def group_seed(seed: int, step: int, group: int) -> int:
    """Seed of group ``group`` of step ``step``: distinct for every (step, group) below one million, and a multiple of
    2**16 below 2**62, so the G samples of a group seeded seed, seed + 1, ... (vLLM's children of an n = G request,
    the continuations of partial rollouts) never share a random stream with another group's (for G <= 65,536).
    Consecutive seeds would: sample i + 1 of group j and sample i of group j + 1 drew the same noise."""
    return (((seed * _PRIME + step) * _PRIME + group) % (1 << 46)) * _SPREAD


def generate_per_group(
    engine, prompt_ids: list[list[int]], seeds: list[int], num_generations: int, params: SamplingParams
) -> Rollouts:
    """Sample each prompt's group with ``engine`` (a :class:`grpokit.rollout.engine.RolloutEngine`) after seeding
    its generator with that group's seed; an engine that seeds groups itself (``takes_group_seeds``, vLLM's)
    takes the seeds in one call."""
    if engine.takes_group_seeds:
        return engine.generate(prompt_ids, num_generations, params, seeds=seeds)
    parts = []
    for prompt, seed in zip(prompt_ids, seeds):
        engine.generator.manual_seed(seed)
        parts.append(engine.generate([prompt], num_generations, params))
    return concat_rollouts(parts, engine.pad_token_id)


def split_rollouts(rollouts: Rollouts, parts: int) -> list[Rollouts]:
    """``rollouts`` of B groups cut into ``parts`` contiguous shares of B / parts groups (B divisible by parts).

    The shares are copies, not views: a pickled view would carry the whole batch's storage.
    """
    G, size = rollouts.num_generations, len(rollouts.prompt_ids) // parts
    rows = size * G
    return [
        Rollouts(
            prompt_ids=rollouts.prompt_ids[k * size : (k + 1) * size],
            completion_ids=rollouts.completion_ids[k * rows : (k + 1) * rows].clone(),  # [rows, T]
            completion_mask=rollouts.completion_mask[k * rows : (k + 1) * rows].clone(),  # [rows, T]
            logprobs=rollouts.logprobs[k * rows : (k + 1) * rows].clone(),  # [rows, T]
            finish_reasons=rollouts.finish_reasons[k * rows : (k + 1) * rows],
            num_generations=G,
            policy_version=rollouts.policy_version,
            loss_mask=None if rollouts.loss_mask is None else rollouts.loss_mask[k * rows : (k + 1) * rows].clone(),
            conversations=None if rollouts.conversations is None else rollouts.conversations[k * rows : (k + 1) * rows],
            columns=None
            if rollouts.columns is None
            else {name: values[k * rows : (k + 1) * rows] for name, values in rollouts.columns.items()},
            token_versions=None
            if rollouts.token_versions is None
            else rollouts.token_versions[k * rows : (k + 1) * rows].clone(),
            **{
                name: None if getattr(rollouts, name) is None else getattr(rollouts, name)[k * rows : (k + 1) * rows]
                for name in COMPLETION_IMAGE_FIELDS
            },
        )
        for k in range(parts)
    ]


def concat_rollouts(parts: list[Rollouts], pad_token_id: int) -> Rollouts:
    """Join Rollouts of the same G and policy version (and their token versions), right-padding to the longest
    completion. Parts with a loss mask (multi-turn, or a rollout_func's env_mask), conversations or reward columns
    join only with parts that have them too (the same column names)."""
    width = max(p.completion_ids.size(1) for p in parts)
    first = parts[0]
    if any((p.loss_mask is None) != (first.loss_mask is None) for p in parts):
        raise ValueError("cannot join rollouts with a loss_mask (multi-turn, env_mask) with rollouts without one")
    if any((p.conversations is None) != (first.conversations is None) for p in parts):
        raise ValueError("cannot join multi-turn rollouts (conversations) with single-turn ones")
    names = None if first.columns is None else list(first.columns)
    if any((None if p.columns is None else list(p.columns)) != names for p in parts):
        raise ValueError("cannot join rollouts whose reward columns differ")

    def padded(t: torch.Tensor, value) -> torch.Tensor:
        return torch.nn.functional.pad(t, (0, width - t.size(1)), value=value)  # [n, T]

    return Rollouts(
        prompt_ids=[p for part in parts for p in part.prompt_ids],
        completion_ids=torch.cat([padded(p.completion_ids, pad_token_id) for p in parts]),  # [N, T]
        completion_mask=torch.cat([padded(p.completion_mask, 0.0) for p in parts]),  # [N, T]
        logprobs=torch.cat([padded(p.logprobs, 0.0) for p in parts]),  # [N, T]
        finish_reasons=[r for p in parts for r in p.finish_reasons],
        num_generations=first.num_generations,
        policy_version=min(p.policy_version for p in parts),
        loss_mask=None if first.loss_mask is None else torch.cat([padded(p.loss_mask, 0.0) for p in parts]),  # [N, T]
        conversations=None if first.conversations is None else [c for p in parts for c in p.conversations],
        columns=None if names is None else {name: [v for p in parts for v in p.columns[name]] for name in names},
        token_versions=_joined_versions(parts, padded),
        **{name: _joined_rows(parts, name, empty) for name, empty in zip(COMPLETION_IMAGE_FIELDS, (None, [], []))},
    )


# Rollouts' per-completion images a tool showed (rollout.types.Rollouts): N entries each, None on every part without
COMPLETION_IMAGE_FIELDS = ("completion_pixels", "completion_images", "completion_image_hashes")


def _joined_rows(parts: list[Rollouts], name: str, empty) -> list | None:
    """The parts' per-completion list ``name`` joined; a part without it gives ``empty`` per completion; None when
    no part has it."""
    if all(getattr(p, name) is None for p in parts):
        return None
    out = []
    for p in parts:
        values = getattr(p, name)
        out += list(values) if values is not None else [empty] * p.completion_ids.size(0)
    return out


def _joined_versions(parts: list[Rollouts], padded) -> torch.Tensor | None:
    """The parts' ``token_versions`` joined ([N, T], 0 on padding); a part without them has every token by its
    ``policy_version``; None when no part has them."""
    if all(p.token_versions is None for p in parts):
        return None
    return torch.cat(
        [
            padded(p.token_versions if p.token_versions is not None else p.policy_version * p.completion_mask.long(), 0)
            for p in parts
        ]
    )  # [N, T]
