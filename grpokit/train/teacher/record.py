"""The teacher's log-probs of a step onto its rollout records, for the store (grpokit/store/teacher_values.py)."""

from __future__ import annotations


def attach_teacher_logprobs(records: list, sampled, distiller) -> None:
    """Set ``teacher_logprobs`` (little-endian float32 bytes, one per token) and ``teacher_tokens_key`` on the records
    (this rank's, in its rollouts' order) of the rows the step trained on; nothing without a teacher or without an
    update this step."""
    kept = None if distiller is None else distiller.take_teacher_logprobs()
    if kept is None:
        return
    kept, keys = kept
    trained = sampled.trained
    rows = range(trained.completion_ids.size(0)) if sampled.train_rows is None else sampled.train_rows.tolist()
    values = kept.float().cpu().numpy().astype("<f4")
    for j, (row, length) in enumerate(zip(rows, trained.completion_lengths.tolist())):
        records[row].teacher_logprobs = values[j, :length].tobytes()
        records[row].teacher_tokens_key = keys[j]
