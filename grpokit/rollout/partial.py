"""Partial rollouts under bounded staleness (``generation.vllm_partial_rollout_tokens`` S, with
``distributed.max_staleness`` K >= 1): a sample's first S tokens are sampled by the version its batch was admitted
with, the rest by the next one. The rule and its pure pieces here (:func:`switch_version` to :func:`merge`, and
:class:`VersionWait`) are shared by vLLM Ray rollout workers (:mod:`grpokit.distributed.ray_partial_tails`) and a
vLLM server sampling ahead (:mod:`grpokit.train.experience.server_partial`); nothing here imports Ray or
torch.distributed, so a single process that samples from a server never imports :mod:`grpokit.distributed`.

**The rule.** The batch of step b is admitted with version v (``b - 1 - K`` once the run is going, 0 for the first
K + 1 batches; docs/async.md, "The bound"). Its samples' tokens [0, S) are sampled by v, and tokens from S on by

    w = min(v + 1, b - 1)            (:func:`switch_version`; w == v: no switch)

Version b - 1 is the newest that exists before step b trains, so w is always published before the learner takes
batch b, and before a checkpoint or an evaluation after step c waits for the batches admitted up to c + K (their
w <= c). Only batch 1 (v = 0, nothing trained yet) has no switch. The switch point is a token count, not a moment,
so what a batch holds is a function of (seed, step, v, w) whatever the threads' timing: a resume stays exact.

**How (verl's abort-and-resubmit form).** The admitted batch is sampled as without the switch but for at most S
tokens (:func:`head_params`): the same requests and seeds, so its first S tokens are the ones a run without partial
rollouts samples. The samples that are still going (exactly S tokens, finish ``length``) are then continued as new
requests by version w (:func:`continuations`): prompt + their S tokens as the prompt (vLLM recomputes it with the
new weights), n = 1, a seed of their own (:func:`continuation_seed`), max_tokens = max_completion_length - S
(:func:`tail_params`). The learner's producer thread waits for w to be published (at most
``vllm_partial_rollout_timeout`` seconds, then :class:`PartialRolloutTimeout`, one line) before it submits them.

Each token keeps the log-prob vLLM returned when it sampled it, so ``Rollouts.logprobs`` (the behaviour policy of
the off-policy corrections) is, token by token, the policy that sampled it; :func:`merge` records each token's
version in ``Rollouts.token_versions`` and keeps ``policy_version`` = v, the oldest (``policy_staleness``).
"""

from __future__ import annotations

import dataclasses
import threading

import torch

from grpokit.rollout.types import Rollouts, SamplingParams

_PRIME = 1_000_003


class PartialRolloutTimeout(RuntimeError):
    """The version a partial rollout continues on was not published in time (one line naming the fix)."""

    @classmethod
    def waited(cls, timeout: float, version: int) -> PartialRolloutTimeout:
        """The error of a wait of ``timeout`` seconds for ``version`` (Ray workers' and a server's)."""
        return cls(
            f"a partial rollout waited {timeout:g} s for policy version {version} (the learner's weights after step "
            f"{version}), which it continues on; raise generation.vllm_partial_rollout_timeout if the learner's steps "
            "are that slow, or set vllm_partial_rollout_tokens: null."
        )


class VersionWait:
    """The wait of partial rollouts' producer thread for the version a batch continues on, shared by the Ray workers'
    (:class:`~grpokit.distributed.ray_partial_tails.PartialTails`) and a server's
    (:class:`~grpokit.train.experience.server_partial.VersionCopies`): a condition, and :meth:`interrupt` to end
    every wait when the run ends. ``timeout``: seconds a wait may take."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self._cond = threading.Condition()
        self._interrupted = False

    def _wait(self, ready, version: int) -> None:
        """With ``self._cond`` held: until ``ready()``; raises after ``timeout`` seconds or once interrupted."""
        self._cond.wait_for(lambda: ready() or self._interrupted, timeout=self.timeout)
        if ready():
            return
        if self._interrupted:
            raise RuntimeError(f"stopped waiting for policy version {version}: the run is ending")
        raise PartialRolloutTimeout.waited(self.timeout, version)

    def interrupt(self) -> None:
        """Stop any wait (the run is ending: a version may never come)."""
        with self._cond:
            self._interrupted = True
            self._cond.notify_all()


def switch_version(step: int, version: int) -> int | None:
    """The version that samples the tokens from S on of step ``step``'s batch, admitted with ``version``:
    min(version + 1, step - 1); None when that is ``version`` itself (no newer one can exist before the step)."""
    target = min(version + 1, step - 1)
    return target if target > version else None


def head_params(params: SamplingParams, tokens: int) -> SamplingParams:
    """The sampling of a sample's first ``tokens`` tokens: at most that many, and as many of min_new_tokens as fit."""
    return dataclasses.replace(params, max_completion_length=tokens, min_new_tokens=min(params.min_new_tokens, tokens))


def tail_params(params: SamplingParams, tokens: int) -> SamplingParams:
    """The sampling of the rest after ``tokens`` tokens: the remaining length and the remaining min_new_tokens."""
    return dataclasses.replace(
        params,
        max_completion_length=params.max_completion_length - tokens,
        min_new_tokens=max(0, params.min_new_tokens - tokens),
    )


def continuation_seed(seed: int) -> int:
    """The seed of a sample's continuation, from the seed vLLM sampled its first tokens with."""
    return (seed * _PRIME + 1) % (2**63 - 1)


def continuations(
    head: Rollouts, seeds: list[int], tokens: int, greedy: bool
) -> tuple[list[int], list[list[int]], list[int]]:
    """The samples of ``head`` (sampled with at most ``tokens`` tokens, one seed per group in ``seeds``) to continue:
    (their rows, their prompts with their tokens so far appended, their continuations' seeds). A sample continues when
    it stopped at the length limit with exactly ``tokens`` tokens (an EOS, or the model's context, ended the others).
    Sample i of a group was sampled with the group's seed + i (vLLM's seeds of an n = G request's children; greedy:
    the group's seed)."""
    G = head.num_generations
    lengths = head.completion_lengths.tolist()
    rows, prompts, tail_seeds = [], [], []
    for row, (n, reason) in enumerate(zip(lengths, head.finish_reasons)):
        if n != tokens or reason != "length":
            continue
        group, i = divmod(row, G)
        rows.append(row)
        prompts.append(list(head.prompt_ids[group]) + head.completion_ids[row, :n].tolist())
        tail_seeds.append(continuation_seed(seeds[group] + (0 if greedy else i)))
    return rows, prompts, tail_seeds


def continue_chunk(
    head: Rollouts, seeds: list[int], tokens: int, tail: SamplingParams, switch: int, pad_token_id: int, sample
) -> tuple[Rollouts, float | None]:
    """``head`` (a chunk's samples of at most ``tokens`` tokens, one seed per group in ``seeds``) with its
    :func:`continuations` sampled by ``sample(prompts, seeds) -> (Rollouts, gap)`` (version ``switch``, ``tail``'s
    sampling) and :func:`merge`d in; the continuations' sync gap (None: none was checked, or none continued)."""
    rows, prompts, tail_seeds = continuations(head, seeds, tokens, tail.greedy)
    if not rows:
        return head, None
    continued, gap = sample(prompts, tail_seeds)
    return merge(head, rows, continued, switch, pad_token_id), gap


def merge(head: Rollouts, rows: list[int], tail: Rollouts | None, switch: int, pad_token_id: int) -> Rollouts:
    """``head``'s samples with ``tail``'s completions (one per row of ``rows``, in order; sampled by ``switch``)
    appended to those rows: their tokens, log-probs and finish reasons; ``token_versions`` [N, T] holds
    ``head.policy_version`` on the first tokens and ``switch`` on the appended ones (0 on padding; None when no row
    was continued)."""
    if not rows:
        return head
    N = head.completion_ids.size(0)
    head_lengths = head.completion_lengths.tolist()
    tail_lengths = tail.completion_lengths.tolist()
    total = list(head_lengths)
    for k, row in enumerate(rows):
        total[row] += tail_lengths[k]
    width = max([*total, 1])
    completion_ids = torch.full((N, width), pad_token_id, dtype=torch.long)  # [N, T]
    completion_mask = torch.zeros((N, width), dtype=torch.float32)  # [N, T]
    logprobs = torch.zeros((N, width), dtype=torch.float32)  # [N, T]
    versions = torch.zeros((N, width), dtype=torch.long)  # [N, T]
    for row, n in enumerate(head_lengths):
        completion_ids[row, :n] = head.completion_ids[row, :n]
        completion_mask[row, :n] = 1.0
        logprobs[row, :n] = head.logprobs[row, :n]
        versions[row, :n] = head.policy_version
    reasons = list(head.finish_reasons)
    for k, row in enumerate(rows):
        a, m = head_lengths[row], tail_lengths[k]
        completion_ids[row, a : a + m] = tail.completion_ids[k, :m]
        completion_mask[row, a : a + m] = 1.0
        logprobs[row, a : a + m] = tail.logprobs[k, :m]
        versions[row, a : a + m] = switch
        reasons[row] = tail.finish_reasons[k]
    return dataclasses.replace(
        head,
        completion_ids=completion_ids,
        completion_mask=completion_mask,
        logprobs=logprobs,
        finish_reasons=reasons,
        token_versions=versions,
    )
