"""Each completion token's policy version, as the rollout store keeps it: a compact list of runs.

A completion sampled by one policy (every engine's, and a partial rollout that no weight update reached) is stored
as NULL in ``rollouts.token_versions``: its tokens are all by ``rollouts.policy_version``. A partial rollout whose
generation continued on newer weights (:mod:`grpokit.rollout.vllm.partial`) is stored as JSON runs
``[[first_token, version], ...]``: token ``first_token`` and the ones after it, up to the next run, were sampled by
``version``. ``[[0, 3], [5, 4]]`` on 8 tokens: tokens 0-4 by version 3, tokens 5-7 by version 4. Stores written
before the column existed read as NULL everywhere, which means the same thing (no migration).
"""

from __future__ import annotations

import json
from collections.abc import Sequence


def version_runs(versions: Sequence[int], policy_version: int) -> list[list[int]] | None:
    """The runs of a completion's per-token ``versions``; None when every token is by ``policy_version`` (also for
    an empty completion)."""
    runs: list[list[int]] = []
    for i, version in enumerate(versions):
        if not runs or runs[-1][1] != version:
            runs.append([i, int(version)])
    if not runs or (len(runs) == 1 and runs[0][1] == policy_version):
        return None
    return runs


def expand_runs(runs: Sequence[Sequence[int]] | str | None, length: int, policy_version: int) -> list[int]:
    """A completion's ``length`` per-token versions from its stored runs (a list, its JSON text, or None: all by
    ``policy_version``)."""
    if isinstance(runs, str):
        runs = json.loads(runs)
    if not runs:
        return [policy_version] * length
    starts = [int(start) for start, _ in runs]
    if starts[0] != 0 or starts != sorted(set(starts)) or starts[-1] >= max(length, 1):
        raise ValueError(f"token_versions runs {list(runs)} do not cover a completion of {length} tokens from token 0")
    versions: list[int] = []
    for k, (start, version) in enumerate(runs):
        end = starts[k + 1] if k + 1 < len(runs) else length
        versions += [int(version)] * (end - int(start))
    return versions
