"""Resume replay: a resumed distillation run reuses the teacher's stored log-probs of the tokens it scored before.

A run resumed from its checkpoint at step k drops the store's steps after k and does them again (the store's
``rollback_after``). With a seeded sampler that draws the same tokens again (grpokit's own: the kill -9 resume test
gets the same completions), the teacher would score the same tokens a second time. So before the store drops them,
the loop reads their teacher log-probs by :func:`tokens_key` (the teacher's name, the prompt's and the completion's
token ids); a step whose every row has a stored value for the very same tokens takes them instead of a teacher call.
A step with any other row (another sampler, vLLM's non-bitwise sampling, a changed dataset) asks the teacher for
the whole step. Rank 0 reads the store, so under torchrun only rank 0's rows are replayed.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np


def tokens_key(teacher: str, prompt_ids, completion_ids) -> str:
    """sha256 of the teacher's name and the prompt's and the completion's token ids (int64, the prompt's ids then
    -1 then the completion's)."""
    ids = np.asarray([*prompt_ids, -1, *completion_ids], dtype="<i8")
    return hashlib.sha256(teacher.encode() + b"\0" + ids.tobytes()).hexdigest()


def row_keys(teacher: str, rollouts) -> list[str]:
    """:func:`tokens_key` of each row of ``rollouts`` (its completion's first ``completion_lengths`` tokens)."""
    ids, lengths = rollouts.completion_ids.tolist(), rollouts.completion_lengths.tolist()
    groups = rollouts.group_index.tolist()
    return [tokens_key(teacher, rollouts.prompt_ids[g], row[:n]) for row, n, g in zip(ids, lengths, groups)]


def stored_after(run_dir: str | Path, step: int) -> dict[str, list[float]]:
    """{tokens_key: teacher log-probs} of the run folder's stored steps after ``step`` ({}: no store yet)."""
    from grpokit.store import RolloutStore

    path = Path(run_dir) / "rollouts.sqlite"
    if not path.is_file():
        return {}
    with RolloutStore(path, readonly=True) as store:
        return store.teacher_logprobs_by_tokens(step)
