"""On-policy distillation's math: a teacher's log-probs turned into a per-token advantage term, and the
full-distribution divergences over the teacher's top-k with a tail bucket.

The per-token term (slime's ``--use-opd``, prime-rl's ``opd``): each sampled token y_t of a completion gets

    A_t <- A_t - lambda * (log pi_student(y_t) - log pi_teacher(y_t))

so that the policy gradient of any loss, with any advantage estimator, minimises the reverse KL
KL(pi_student || pi_teacher) on the student's own samples (log pi_s(y) - log pi_t(y) is its one-sample estimate;
its mean over the student's samples is the reverse KL). The student's log-probs enter detached, as an advantage.

The top-k terms compare two (k + 1)-bucket distributions: the teacher's k most likely tokens at a position, each its
own bucket, and one tail bucket holding the rest of the mass, for the teacher and the student alike. Both are proper
distributions, so each divergence is >= 0 by construction (the data-processing inequality makes it a lower bound of
the full-vocabulary divergence); no clamp at 0 is needed (verl #7855 clamped a top-k forward KL estimate at 0).

Temperatures are explicit: :func:`tempered_logprobs` takes the logits and the temperature they are scored at (the
teacher at ``teacher_temperature``, 1 unless set; the student at the sampling temperature, as the loss). A teacher
whose vocabulary is padded past the student's (Qwen2.5's 151,936 vs 152,064 rows) is sliced to the shared ids before
the softmax (:func:`shared_vocab`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

DISTILL_LOSSES = ("reverse_kl", "forward_kl_topk", "jsd")
TAIL_FLOOR = 1e-12  # the tail bucket's smallest probability (a top-k holding all the mass leaves ~0)


def shared_vocab(logits: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """``logits`` [..., V_teacher] cut to the first ``vocab_size`` ids (the ids both tokenizers share; the rows past
    them are a padded embedding's, never real tokens). Logits narrower than ``vocab_size`` are refused."""
    if logits.size(-1) < vocab_size:
        raise ValueError(f"the teacher's logits have {logits.size(-1)} ids, fewer than the student's {vocab_size}")
    return logits[..., :vocab_size]


def tempered_logprobs(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """log softmax(logits / temperature) in float32 [..., V]."""
    return torch.log_softmax(logits.float() / temperature, dim=-1)


def sampled_reverse_kl(student_logprobs: torch.Tensor, teacher_logprobs: torch.Tensor) -> torch.Tensor:
    """[N, T] the one-sample reverse-KL estimate of each sampled token: log pi_s(y_t) - log pi_t(y_t)."""
    return student_logprobs.float() - teacher_logprobs.float()


def distill_advantages(
    advantages: torch.Tensor,
    student_logprobs: torch.Tensor,
    teacher_logprobs: torch.Tensor,
    loss_mask: torch.Tensor,
    coef: float,
) -> torch.Tensor:
    """[N, T] per-token advantages: ``advantages`` ([N] per sequence, broadcast over its tokens, or [N, T]) minus
    ``coef`` x (log pi_s - log pi_t) on the tokens of ``loss_mask`` [N, T] (0 elsewhere, where no loss acts)."""
    base = advantages.float()
    if base.dim() == 1:
        base = base[:, None].expand_as(loss_mask)
    term = coef * sampled_reverse_kl(student_logprobs.detach(), teacher_logprobs.detach())
    return (base - term) * loss_mask


def masked_token_mean(values: torch.Tensor, mask: torch.Tensor) -> tuple[float, float]:
    """(sum of ``values`` over ``mask``, token count): a global token mean is the sum of every process's sums over
    the sum of their counts."""
    return float((values.float() * mask).sum()), float(mask.sum())


def topk_buckets(teacher_logprobs: torch.Tensor, student_logprobs: torch.Tensor, k: int):
    """(teacher [..., k+1], student [..., k+1]) log-probs of the teacher's top-``k`` ids at each position, then the
    tail bucket: log(1 - the top-k's mass), floored at ``TAIL_FLOOR``. Both inputs are full log-softmaxes [..., V]
    over the same ids; the student's keeps its gradient."""
    k = min(k, teacher_logprobs.size(-1))
    top_t, ids = teacher_logprobs.topk(k, dim=-1)  # [..., k]
    top_s = student_logprobs.gather(-1, ids)  # [..., k]
    return _with_tail(top_t), _with_tail(top_s)


def _with_tail(top: torch.Tensor) -> torch.Tensor:
    """[..., k] log-probs of k buckets -> [..., k+1] with the tail log(1 - sum exp(top)) appended."""
    mass = top.exp().sum(-1, keepdim=True)
    tail = torch.log((1.0 - mass).clamp(min=TAIL_FLOOR))
    return torch.cat([top, tail], dim=-1)


def kl(p_logprobs: torch.Tensor, q_logprobs: torch.Tensor) -> torch.Tensor:
    """KL(p || q) over the last dimension: sum p (log p - log q)."""
    return (p_logprobs.exp() * (p_logprobs - q_logprobs)).sum(-1)


def jsd(p_logprobs: torch.Tensor, q_logprobs: torch.Tensor) -> torch.Tensor:
    """The Jensen-Shannon divergence: (KL(p || m) + KL(q || m)) / 2 with m = (p + q) / 2."""
    m = torch.logaddexp(p_logprobs, q_logprobs) - torch.log(torch.tensor(2.0, dtype=p_logprobs.dtype))
    return 0.5 * (kl(p_logprobs, m) + kl(q_logprobs, m))


def bucket_divergence(name: str, teacher_buckets: torch.Tensor, student_buckets: torch.Tensor) -> torch.Tensor:
    """[...] the divergence ``name`` between two (k + 1)-bucket log-prob vectors [..., k+1]: reverse_kl = KL(student
    || teacher), forward_kl_topk = KL(teacher || student), jsd = their Jensen-Shannon divergence."""
    if name == "reverse_kl":
        return kl(student_buckets, teacher_buckets)
    if name == "forward_kl_topk":
        return kl(teacher_buckets, student_buckets)
    if name == "jsd":
        return jsd(teacher_buckets, student_buckets)
    raise ValueError(f"distill_loss={name!r}; valid values are {', '.join(DISTILL_LOSSES)}")


def topk_divergence(name: str, teacher_logprobs: torch.Tensor, student_logprobs: torch.Tensor, k: int) -> torch.Tensor:
    """[...] the divergence ``name`` per position between the teacher's and the student's (k + 1)-bucket
    distributions (:func:`topk_buckets`, :func:`bucket_divergence`)."""
    t, s = topk_buckets(teacher_logprobs, student_logprobs, k)
    return bucket_divergence(name, t, s)


def topk_term(name: str, teacher_top: torch.Tensor, teacher_tail: torch.Tensor, student_top: torch.Tensor):
    """[...] the divergence ``name`` from what the learner has: the teacher's top-k log-probs [..., k] and its tail's
    log-mass [...] (log of the mass outside its top-k, as the teacher computed it), and the student's log-probs at
    the teacher's top-k ids [..., k] with their gradient; the student's tail is log(1 - sum exp(student_top))."""
    teacher = torch.cat([teacher_top.float(), teacher_tail.float()[..., None]], dim=-1)
    return bucket_divergence(name, teacher, _with_tail(student_top.float()))


@dataclass
class TeacherTopK:
    """A step's teacher top-k at each completion position: ``ids`` [N, T, k] (int64), ``logprobs`` [N, T, k] and
    ``tail`` [N, T] (the log-mass outside the top-k), float32; 0 past each completion. ``rows`` slices them."""

    ids: torch.Tensor
    logprobs: torch.Tensor
    tail: torch.Tensor

    def __getitem__(self, rows) -> TeacherTopK:
        return TeacherTopK(self.ids[rows], self.logprobs[rows], self.tail[rows])

    def to(self, device) -> TeacherTopK:
        return TeacherTopK(self.ids.to(device), self.logprobs.to(device), self.tail.to(device))


def teacher_topk(logprobs: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(ids [..., k], log-probs [..., k], tail [...]) of full log-probs [..., V]: the k most likely ids and the
    log-mass of the rest, log sum_{v not in top-k} p_v (a logsumexp over the others: exact even when the top-k holds
    nearly all the mass, where log(1 - sum) would round to log 0). k = V leaves a tail of log TAIL_FLOOR."""
    k = min(k, logprobs.size(-1))
    top, ids = logprobs.topk(k, dim=-1)
    if k == logprobs.size(-1):
        return ids, top, torch.full_like(top[..., 0], float(torch.log(torch.tensor(TAIL_FLOOR))))
    rest = logprobs.scatter(-1, ids, float("-inf")).logsumexp(-1)
    return ids, top, rest.clamp(min=float(torch.log(torch.tensor(TAIL_FLOOR))))
