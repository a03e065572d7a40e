"""A step's distillation: the teacher scores the rows the learner trains on, and each sampled token's advantage gets
-distill_coef x (log pi_student - log pi_teacher) (:func:`grpokit.algos.distill.distill_advantages`).

The student's log-probs are the learner's own old log-probs when the step computed them, else the sampler's (the
policy that sampled the tokens, at the sampling temperature). The teacher's log-probs of the step are kept for the
store (:meth:`Distiller.take_teacher_logprobs`), beside the student's. Metrics, over every process's tokens:
``distill/reverse_kl`` (the token mean of log pi_s - log pi_t), ``distill/teacher_logprob_mean`` and
``distill/seconds`` (the teacher's time this step).
"""

from __future__ import annotations

import dataclasses
import time

import torch

from grpokit.algos.distill import distill_advantages, masked_token_mean, sampled_reverse_kl
from grpokit.algos.masked import masked_mean
from grpokit.train.teacher.replay import row_keys, stored_after

REVERSE_KL, TEACHER_LOGPROB, SECONDS = "distill/reverse_kl", "distill/teacher_logprob_mean", "distill/seconds"


def teacher_only(completions, **kwargs) -> list[float]:
    """The reward of a run with a teacher and ``rewards: []``: 0 for every completion, so every group ties and the
    reward advantage is 0; the teacher's term alone teaches (pure on-policy distillation)."""
    return [0.0] * len(completions)


class Distiller:
    """``teacher``: a :class:`~grpokit.train.teacher.local.LocalTeacher` or a served one (``logprobs(rollouts,
    pad_token_id)`` -> [N, T]); ``coef``: lambda; ``procs``: the run's processes (the metrics' global means);
    ``name``: the teacher's name in the stored tokens keys (:mod:`.replay`). ``calls`` counts the steps the teacher
    scored, ``replayed`` those that reused stored values."""

    def __init__(self, teacher, coef: float, procs, pad_token_id: int, name: str = "teacher"):
        self.teacher, self.coef, self.procs, self.pad_token_id = teacher, coef, procs, pad_token_id
        self.name = name
        self._kept: tuple[torch.Tensor, list[str]] | None = None
        self.replay: dict[str, list[float]] = {}
        self.calls = self.replayed = 0

    def replay_from(self, run_dir, step: int) -> None:
        """Resuming at ``step``: keep the run folder's stored teacher log-probs of the steps after it, to be reused
        for the same tokens (:mod:`.replay`)."""
        self.replay = stored_after(run_dir, step)

    def _teacher_logprobs(self, rollouts, keys: list[str]) -> torch.Tensor:
        """[n, T] float32 on the CPU: the stored values when every row's tokens have them, else the teacher's."""
        stored = [self.replay.get(key) for key in keys] if self.replay else None
        if stored and all(values is not None for values in stored):
            out = torch.zeros(rollouts.completion_ids.shape, dtype=torch.float32)
            for i, values in enumerate(stored):
                out[i, : len(values)] = torch.tensor(values, dtype=torch.float32)
            for key in keys:
                self.replay.pop(key, None)
            self.replayed += 1
            return out
        self.calls += 1
        return self.teacher.logprobs(rollouts, self.pad_token_id)

    def adjust(self, found, rollouts, student_logprobs: torch.Tensor | None, loss_mask: torch.Tensor):
        """(``found`` with its advantages per token and the teacher's term added, the step's distill/* metrics).
        ``found``: the algorithm's AdvantageOutputs for ``rollouts``; ``student_logprobs`` [n, T] (None: the
        sampler's, ``rollouts.logprobs``); ``loss_mask`` [n, T]."""
        t0 = time.perf_counter()
        keys = row_keys(self.name, rollouts)
        teacher = self._teacher_logprobs(rollouts, keys)  # [n, T], CPU float32
        seconds = time.perf_counter() - t0
        self._kept = (teacher, keys)
        device = loss_mask.device
        teacher = teacher.to(device)
        student = (rollouts.logprobs if student_logprobs is None else student_logprobs).to(device).float()
        advantages = distill_advantages(found.advantages.to(device), student, teacher, loss_mask, self.coef)
        sums = torch.tensor(
            [
                *masked_token_mean(sampled_reverse_kl(student, teacher), loss_mask),
                masked_token_mean(teacher, loss_mask)[0],
                seconds,
            ],
            dtype=torch.float64,
        )
        kl_sum, count, teacher_sum, seconds = self.procs.sum(sums.to(device)).tolist()
        metrics = {
            REVERSE_KL: kl_sum / max(count, 1.0),
            TEACHER_LOGPROB: teacher_sum / max(count, 1.0),
            SECONDS: seconds / self.procs.world_size,
        }
        found = dataclasses.replace(
            found, advantages=advantages, per_sequence=masked_mean(advantages, loss_mask, dim=-1)
        )
        return found, metrics

    def take_teacher_logprobs(self) -> tuple[torch.Tensor, list[str]] | None:
        """([n, T] the teacher's log-probs of the last :meth:`adjust`, each row's tokens key), then forgotten; None
        when none were taken."""
        kept, self._kept = self._kept, None
        return kept
