"""A step's distillation: the teacher scores the rows the learner trains on, and each sampled token's advantage gets
-distill_coef x (log pi_student - log pi_teacher) (:func:`grpokit.algos.distill.distill_advantages`).

The student's log-probs are the learner's own old log-probs when the step computed them, else the sampler's (the
policy that sampled the tokens, at the sampling temperature). The teacher's log-probs of the step are kept for the
store (:meth:`Distiller.take_teacher_logprobs`), beside the student's. Metrics, over every process's tokens:
``distill/reverse_kl`` (the token mean of log pi_s - log pi_t), ``distill/teacher_logprob_mean``,
``distill/seconds`` (the time the learner waited for the teacher this step) and ``distill/request_seconds`` (the
teacher's own time: a served teacher's request runs on a thread from :meth:`Distiller.start`, beside the learner's
reference pass, so the wait can be shorter).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import torch

from grpokit.algos.distill import TeacherTopK, distill_advantages, masked_token_mean, sampled_reverse_kl
from grpokit.algos.masked import masked_mean
from grpokit.train.teacher.replay import row_keys, stored_after

REVERSE_KL, TEACHER_LOGPROB, SECONDS = "distill/reverse_kl", "distill/teacher_logprob_mean", "distill/seconds"
REQUEST_SECONDS = "distill/request_seconds"


def teacher_only(completions, **kwargs) -> list[float]:
    """The reward of a run with a teacher and ``rewards: []``: 0 for every completion, so every group ties and the
    reward advantage is 0; the teacher's term alone teaches (pure on-policy distillation)."""
    return [0.0] * len(completions)


class Distiller:
    """``teacher``: a :class:`~grpokit.train.teacher.local.LocalTeacher` or a served one (``logprobs(rollouts,
    pad_token_id)`` -> [N, T]); ``coef``: lambda; ``procs``: the run's processes (the metrics' global means);
    ``name``: the teacher's name in the stored tokens keys (:mod:`.replay`). ``calls`` counts the steps the teacher
    scored, ``replayed`` those that reused stored values."""

    def __init__(self, teacher, coef: float, procs, pad_token_id: int, name: str = "teacher", topk: int = 0):
        self.teacher, self.coef, self.procs, self.pad_token_id = teacher, coef, procs, pad_token_id
        self.name = name
        self.topk = topk  # > 0: forward_kl_topk or jsd, a local teacher's top-k for the learner's term
        self._topk: TeacherTopK | None = None  # the last scoring's, for take_topk()
        self._kept: tuple[torch.Tensor, list[str]] | None = None
        self.replay: dict[str, list[float]] = {}
        self.calls = self.replayed = 0
        # a served teacher's request runs on this thread while the learner computes (:meth:`start`)
        self.concurrent = getattr(teacher, "where", "local") == "server"
        self._pool: ThreadPoolExecutor | None = None  # made by the first start(), stopped by close()
        self._pending: tuple | None = None  # (rollouts, keys, [(future of (log-probs, seconds), its row)] per row)
        self._ahead: dict[str, tuple] = {}  # tokens key -> (future, row): requests of batches sampled ahead
        self._lock = threading.Lock()  # ahead() runs on the producer's thread
        self.ahead_requests = 0  # batches whose request began on the producer's thread

    def _submit(self, rollouts, keys: list[str]):
        with self._lock:
            self._pool = self._pool or ThreadPoolExecutor(1, thread_name_prefix="teacher")
            return self._pool.submit(self._timed, rollouts, keys)

    def ahead(self, rollouts) -> None:
        """A served teacher, one step ahead: the request for a batch sampled ahead (max_staleness >= 1) begins as soon
        as the producer has collected it, while the learner still trains an earlier step; :meth:`start` then finds
        every row's request begun and sends none."""
        if not self.concurrent:
            return
        keys = row_keys(self.name, rollouts)
        future = self._submit(rollouts, keys)
        with self._lock:
            self._ahead.update({key: (future, row) for row, key in enumerate(keys)})
            self.ahead_requests += 1

    def start(self, rollouts) -> None:
        """A served teacher: its request for ``rollouts`` begins now, on a thread, so that it overlaps the learner's
        passes before the advantages (reference, old log-probs, values); :meth:`adjust` waits for it. Rows whose
        request began ahead (:meth:`ahead`) are not asked again. A local teacher scores in :meth:`adjust`, in the
        learner's forward schedule beside the reference."""
        if self.concurrent:
            keys = row_keys(self.name, rollouts)
            with self._lock:
                found = [self._ahead.get(key) for key in keys]
            if not all(found):
                future = self._submit(rollouts, keys)
                found = [(future, row) for row in range(len(keys))]
            self._pending = (rollouts, keys, found)

    def _timed(self, rollouts, keys: list[str]) -> tuple[torch.Tensor, float]:
        t0 = time.perf_counter()
        return self._teacher_logprobs(rollouts, keys), time.perf_counter() - t0

    def _scored(self, rollouts) -> tuple[torch.Tensor, list[str], float]:
        """(the teacher's [n, T] log-probs of ``rollouts``, their keys, the request's own seconds): the started
        request's when :meth:`start` was given these rollouts, else scored now."""
        pending, self._pending = self._pending, None
        if pending is not None and pending[0] is rollouts:
            return self._gathered(rollouts, *pending[1:])
        keys = row_keys(self.name, rollouts)
        teacher, seconds = self._timed(rollouts, keys)
        return teacher, keys, seconds

    def _gathered(self, rollouts, keys: list[str], found: list[tuple]) -> tuple[torch.Tensor, list[str], float]:
        """:meth:`_scored` of begun requests: each row's values taken from its request's answer (a failed request
        raises here, in the learner's thread); the seconds are those of the requests used."""
        futures = {id(future): future for future, _ in found}
        answers = {key: future.result() for key, future in futures.items()}
        out = torch.zeros(rollouts.completion_ids.shape, dtype=torch.float32)
        for i, (future, row) in enumerate(found):
            values = answers[id(future)][0][row]
            width = min(out.size(1), values.size(0))
            out[i, :width] = values[:width]
        with self._lock:  # the requests used are done with: their rows (trained or filtered out) are forgotten
            self._ahead = {k: v for k, v in self._ahead.items() if id(v[0]) not in futures}
        return out, keys, sum(seconds for _, seconds in answers.values())

    def close(self) -> None:
        """Stop the request thread (a pending request is awaited)."""
        self._ahead = {}
        pool, self._pool, self._pending = self._pool, None, None
        if pool is not None:
            pool.shutdown(wait=True)

    def replay_from(self, run_dir, step: int) -> None:
        """Resuming at ``step``: keep the run folder's stored teacher log-probs of the steps after it, to be reused
        for the same tokens (:mod:`.replay`)."""
        self.replay = stored_after(run_dir, step)

    def _teacher_logprobs(self, rollouts, keys: list[str]) -> torch.Tensor:
        """[n, T] float32 on the CPU: the stored values when every row's tokens have them, else the teacher's. With
        top-k terms the local teacher always scores (its top-k is not stored: a resume computes it again, the same
        numbers from the same frozen teacher and tokens), and keeps its top-k for :meth:`take_topk`."""
        if self.topk:
            with self._lock:
                self.calls += 1
            sampled, self._topk = self.teacher.scored(rollouts, self.pad_token_id, self.topk)
            return sampled
        with self._lock:  # the producer's thread (ahead) and the learner's both come here
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
        teacher, keys, request = self._scored(rollouts)  # [n, T], CPU float32
        seconds = time.perf_counter() - t0  # what the learner waited for it
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
                request,
            ],
            dtype=torch.float64,
        )
        kl_sum, count, teacher_sum, seconds, request = self.procs.sum(sums.to(device)).tolist()
        metrics = {
            REVERSE_KL: kl_sum / max(count, 1.0),
            TEACHER_LOGPROB: teacher_sum / max(count, 1.0),
            SECONDS: seconds / self.procs.world_size,
            REQUEST_SECONDS: request / self.procs.world_size,
        }
        if self.topk:  # top-k terms: the learner adds the term to the loss (take_topk); the advantages stay
            return found, metrics
        found = dataclasses.replace(
            found, advantages=advantages, per_sequence=masked_mean(advantages, loss_mask, dim=-1)
        )
        return found, metrics

    def take_topk(self) -> TeacherTopK | None:
        """The teacher's top-k of the last :meth:`adjust` (forward_kl_topk, jsd), then forgotten; None otherwise."""
        kept, self._topk = self._topk, None
        return kept

    def take_teacher_logprobs(self) -> tuple[torch.Tensor, list[str]] | None:
        """([n, T] the teacher's log-probs of the last :meth:`adjust`, each row's tokens key), then forgotten; None
        when none were taken."""
        kept, self._kept = self._kept, None
        return kept
