"""On-policy distillation's full-distribution term in the learner's objective (``distill_loss: forward_kl_topk | jsd``
with a local teacher): at each completion token the divergence between the teacher's and the student's (k + 1)-bucket
distributions (the teacher's top-k ids and a tail; :func:`grpokit.algos.distill.topk_term`), its token mean over a
micro-batch's loss tokens times ``distill_coef`` added to the policy loss, whatever the loss type (the term is not
in the advantages: its gradient flows through the student's log-probs at the k ids). Metric ``distill/<loss>``:
the divergence's token mean (the learner averages micro-batches as it does the loss's other means).
"""

from __future__ import annotations

import torch

from grpokit.algos.distill import TeacherTopK, topk_term


def distill_term(
    name: str, coef: float, teacher: TeacherTopK, student_topk: torch.Tensor, mask: torch.Tensor, micro_tokens
) -> tuple[torch.Tensor, dict[str, float]]:
    """(coef x the token sum of the divergence over ``mask`` [n, T] / ``micro_tokens`` (the micro-batch's loss
    tokens: a chunk of a micro-batch gets its share), its metrics). ``student_topk`` [n, T, k]: the student's
    log-probs at ``teacher.ids`` with their gradient."""
    divergence = topk_term(name, teacher.logprobs, teacher.tail, student_topk)  # [n, T]
    mask = mask.float()
    summed = (divergence * mask).sum()
    term = coef * summed / torch.as_tensor(micro_tokens, dtype=torch.float32).clamp(min=1.0)
    mean = float(summed.detach()) / max(float(mask.sum()), 1.0)
    return term, {f"distill/{name}": mean}
