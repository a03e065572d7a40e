"""Per-token log-probs of completions under a model, for any supported model kind.

The batch layout is built once per step (:func:`build_batch`) and reused for the reference, old
and policy passes. HF models see [left-padded prompt | completion] with an attention mask and
position ids, and ``logits_to_keep`` so the LM head only runs on completion positions (TRL's layout).
Custom models (no attention mask) see each row as prompt + completion, right-padded, which leaves
every real position unaffected under a causal model; their logits are gathered at each row's
completion positions.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from grpokit.algos import entropy_from_logits, selective_logprobs
from grpokit.modeling import is_hf_model, logits_of
from grpokit.rollout.engine import left_pad
from grpokit.rollout.types import Rollouts


@dataclass
class Batch:
    """Model inputs for N sequences; rows of one micro-batch are taken with :meth:`rows`."""

    input_ids: torch.Tensor  # [N, L]
    attention_mask: torch.Tensor | None  # [N, L] (HF layout) or None (custom layout)
    position_ids: torch.Tensor | None  # [N, L] (HF layout) or None
    completion_ids: torch.Tensor  # [N, T]
    completion_mask: torch.Tensor  # [N, T]
    gather_index: torch.Tensor | None  # [N, T] logit positions of completion tokens (custom layout)

    def rows(self, index: slice) -> "Batch":
        pick = lambda x: None if x is None else x[index]  # noqa: E731
        return Batch(*(pick(getattr(self, f)) for f in self.__dataclass_fields__))

    def __len__(self) -> int:
        return self.input_ids.size(0)


def build_batch(model: torch.nn.Module, rollouts: Rollouts, pad_token_id: int, device: torch.device) -> Batch:
    G = rollouts.num_generations
    completion_ids = rollouts.completion_ids.to(device)  # [N, T]
    completion_mask = rollouts.completion_mask.to(device)  # [N, T]
    if is_hf_model(model):
        prompt_ids, prompt_mask = left_pad(rollouts.prompt_ids, pad_token_id, device)  # [B, P]
        input_ids = torch.cat([prompt_ids.repeat_interleave(G, 0), completion_ids], dim=1)  # [N, P+T]
        attention_mask = torch.cat([prompt_mask.repeat_interleave(G, 0), completion_mask.long()], dim=1)  # [N, P+T]
        position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)  # [N, P+T]
        return Batch(input_ids, attention_mask, position_ids, completion_ids, completion_mask, None)
    rows = [p for p in rollouts.prompt_ids for _ in range(G)]
    T = completion_ids.size(1)
    width = max(len(p) for p in rows) + T
    input_ids = torch.full((len(rows), width), pad_token_id, dtype=torch.long, device=device)
    gather_index = torch.empty((len(rows), T), dtype=torch.long, device=device)
    for i, p in enumerate(rows):
        input_ids[i, : len(p)] = torch.tensor(p, device=device)
        input_ids[i, len(p) : len(p) + T] = completion_ids[i]
        gather_index[i] = torch.arange(len(p) - 1, len(p) - 1 + T, device=device)  # logits at t predict token t+1
    return Batch(input_ids, None, None, completion_ids, completion_mask, gather_index)


def completion_logits(model: torch.nn.Module, batch: Batch) -> torch.Tensor:
    """Logits that predict each completion token: [n, T, V]."""
    T = batch.completion_ids.size(1)
    if batch.attention_mask is not None:
        out = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=batch.position_ids,
                    use_cache=False, logits_to_keep=T + 1)
        return out.logits[:, :-1]  # [n, T, V]
    logits = logits_of(model(batch.input_ids))  # [n, L, V]
    index = batch.gather_index[..., None].expand(-1, -1, logits.size(-1))  # [n, T, V]
    return logits.gather(1, index)  # [n, T, V]


def completion_logprobs(model: torch.nn.Module, batch: Batch, temperature: float, with_entropy: bool = False):
    """(logprobs [n, T], entropy [n, T] or None) of the completion tokens at ``temperature``."""
    logits = completion_logits(model, batch)
    logprobs = selective_logprobs(logits, batch.completion_ids, temperature=temperature)
    entropy = None
    if with_entropy:
        with torch.no_grad():
            entropy = entropy_from_logits(logits.detach(), temperature=temperature)
    return logprobs, entropy


@torch.no_grad()
def batched_logprobs(model: torch.nn.Module, batch: Batch, temperature: float, micro_batch_size: int) -> torch.Tensor:
    """Log-probs [N, T] without grad, micro-batch by micro-batch (reference and old-policy passes)."""
    out = [completion_logprobs(model, batch.rows(slice(i, i + micro_batch_size)), temperature)[0].float()
           for i in range(0, len(batch), micro_batch_size)]
    return torch.cat(out)
