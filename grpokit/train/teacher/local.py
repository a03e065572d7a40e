"""A local teacher: a frozen causal LM in its own dtype on its own device, scoring the student's sampled tokens.

It runs where the reference runs, in the learner's step before the advantages are formed, over the same batch layout
(:func:`grpokit.train.learning.policy_logprobs.build_batch`, built for the teacher's own kind of model), micro-batch
by micro-batch, in inference mode. Its logits are cut to the ids both models score (:mod:`.tokens`) and turned into
log-probs at ``teacher_temperature`` (:func:`grpokit.algos.distill.tempered_logprobs`), never under the student's
autocast: the teacher computes in the dtype it was loaded in.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from grpokit.algos.distill import TeacherTopK, shared_vocab, teacher_topk, tempered_logprobs
from grpokit.kernels import Kernels
from grpokit.train.learning.policy_logprobs import build_batch, completion_features


class LocalTeacher:
    """``model`` (frozen here), scored on its first ``width`` ids at ``temperature``, ``rows`` rows per pass."""

    def __init__(self, model: torch.nn.Module, width: int, temperature: float, rows: int):
        self.model = model.eval()
        self.model.requires_grad_(False)
        self.width, self.temperature, self.rows = width, temperature, rows
        self.device = next(model.parameters()).device
        self.kernels = Kernels.select(self.device)
        self.where = "local"

    def logprobs(self, rollouts, pad_token_id: int) -> torch.Tensor:
        """[N, T] float32 on the CPU: the teacher's log-prob of each sampled token (0 past each completion)."""
        return self.scored(rollouts, pad_token_id, 0)[0]

    @torch.inference_mode()
    def scored(self, rollouts, pad_token_id: int, k: int) -> tuple[torch.Tensor, TeacherTopK | None]:
        """([N, T] the sampled tokens' log-probs, and with ``k`` > 0 the teacher's top-k at each completion position:
        ids, log-probs and the tail's log-mass (:func:`grpokit.algos.distill.teacher_topk`); float32 on the CPU, 0
        past each completion), from one pass."""
        batch = build_batch(self.model, rollouts, pad_token_id, self.device)
        T = batch.completion_ids.size(1)
        parts, tops = [], []
        for start in range(0, len(batch), self.rows):
            part = batch.rows(slice(start, start + self.rows))
            width = max(int(part.completion_mask.sum(1).max()), 1)
            logits = completion_features(self.model, None, part, width, self.kernels)  # [n, w, V_teacher]
            logp = tempered_logprobs(shared_vocab(logits, self.width), self.temperature)  # [n, w, V]
            mask = part.completion_mask[:, :width]
            picked = logp.gather(-1, part.completion_ids[:, :width, None]).squeeze(-1) * mask  # [n, w]
            parts.append(F.pad(picked, (0, T - width)))
            if k > 0:
                ids, top, tail = teacher_topk(logp, k)  # [n, w, k], [n, w, k], [n, w]
                ids, top, tail = ids * mask[..., None].long(), top * mask[..., None], tail * mask
                tops.append(
                    (F.pad(ids, (0, 0, 0, T - width)), F.pad(top, (0, 0, 0, T - width)), F.pad(tail, (0, T - width)))
                )
        sampled = torch.cat(parts).float().cpu().clone()
        if k == 0:
            return sampled, None
        ids, top, tail = (torch.cat(x).cpu().clone() for x in zip(*tops))
        return sampled, TeacherTopK(ids.long(), top.float(), tail.float())


def teacher_dtype(name: str, device: torch.device) -> torch.dtype:
    """``teacher_dtype``'s torch dtype: auto = bfloat16 on a GPU that has it, else float32."""
    if name == "auto":
        bf16 = device.type == "cuda" and torch.cuda.is_bf16_supported()
        return torch.bfloat16 if bf16 else torch.float32
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]
