"""The per-token values a step keeps in the store (``run.store_token_values``): the learner's, taken from its update
(``Learner.take_token_values``: nothing is computed again), and the sampler-learner gap, attached to the step's
rollout records before they are gathered to rank 0 (``grpokit/store/token_values.py`` stores them)."""

from __future__ import annotations

import torch

from grpokit.store.token_values import FLOAT16_MAX


def attach_token_values(records: list, sampled, kept: dict | None, names: tuple[str, ...], tokenizer) -> None:
    """Set ``per_token`` on the records (this rank's, in its rollouts' order) of the rows the step trained on.

    ``sampled``: the step's Trajectory; ``kept``: the learner's ``logprob``, ``entropy`` and ``weight`` [n, T] of the
    trained rows (None: no update this step, nothing attached); ``names``: the values to keep; ``tokenizer`` decodes
    each token on its own. ``gap`` = the learner's log-prob - the sampler's (``rollouts.logprobs``)."""
    if not names or kept is None:
        return
    trained = sampled.trained
    values = {name: kept[name].detach().float().cpu() for name in ("logprob", "entropy", "weight") if name in names}
    if "gap" in names:
        values["gap"] = kept["logprob"].detach().float().cpu() - trained.logprobs.float().cpu()  # [n, T]
    rows = range(trained.completion_ids.size(0)) if sampled.train_rows is None else sampled.train_rows.tolist()
    lengths = trained.completion_lengths.tolist()
    ids = trained.completion_ids.cpu().tolist()
    distinct = sorted({token for j, n in enumerate(lengths) for token in ids[j][:n]})
    text = dict(zip(distinct, tokenizer.batch_decode([[token] for token in distinct])))  # each distinct token once
    halves = {name: _float16(values[name]) for name in names}  # [n, T] little-endian float16
    for j, (row, length) in enumerate(zip(rows, lengths)):
        per_token = {"tokens": [text[token] for token in ids[j][:length]]}
        for name in names:
            per_token[name] = halves[name][j, :length].tobytes()
        records[row].per_token = per_token


def _float16(values: torch.Tensor):
    """Little-endian float16 of ``values`` (clamped to +-65504, NaN kept) as a numpy array: a row's ``tobytes()`` is
    what ``store.token_values.decode`` reads."""
    return values.clamp(-FLOAT16_MAX, FLOAT16_MAX).to(torch.float16).numpy().astype("<f2")
