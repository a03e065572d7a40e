"""Per-token log-probs of completions under a model, for any supported model kind.

The batch (:func:`build_batch`) is built once per step and reused for the reference, old and
policy passes. Three ways to run a model over it:

* shared prefix (HF models): the prompts of a micro-batch's groups are run once, their KV cache is
  gathered to the G rows of each group, and the completions are run on top of it. The prompt is
  computed once per group instead of G times, in the no-grad passes and in training alike (the
  gather is differentiable, so the G rows' gradients add up on the shared prompt, as they would
  over G copies). Same numbers as a full forward pass (tests check it within 1e-5 in float32).
* full forward (HF models under DDP or FSDP, see :func:`data_parallel`, or with gradient
  checkpointing, which turns the KV cache off): [left-padded prompt | completion]
  with an attention mask, position ids and ``logits_to_keep`` (TRL's layout).
* custom models (no attention mask): each row is prompt + completion, right-padded, which leaves
  every real position unaffected under a causal model; logits are gathered at completion positions.

In every case only completion positions reach the LM head, and a micro-batch runs only up to its
longest completion (right padding past it is dropped, and the results are padded back). The fast
paths come from the run's :class:`grpokit.kernels.Kernels`: the fused LM head for models with a plain
Linear head, sparse embedding gradients, and, for HF models on "sdpa", plain attention for small CPU
calls.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from grpokit.algos import entropy_from_logits, selective_logprobs
from grpokit.kernels import Kernels
from grpokit.models.cache_rows import fresh_state_writes, select_rows
from grpokit.models.kv_cache_arg import cache_kwargs, output_cache
from grpokit.models.loading import activation_checkpointing, is_hf_model, logits_of
from grpokit.models.vision_inputs import (
    batch_inputs,
    conversation_inputs,
    has_images,
    next_positions,
    prompt_positions,
    with_positions,
)
from grpokit.rollout.engine import left_pad
from grpokit.rollout.types import Rollouts

# Completion positions per chunk of a no-grad pass through the fused head.
NO_GRAD_POSITIONS = 4096


@dataclass
class Batch:
    """Model inputs for N sequences; rows of one micro-batch are taken with :meth:`rows`."""

    completion_ids: torch.Tensor  # [N, T]
    completion_mask: torch.Tensor  # [N, T]
    group_index: torch.Tensor  # [N] row -> its prompt
    prompt_ids: torch.Tensor | None = None  # [B, P] left-padded (HF layout); shared by all row slices
    prompt_mask: torch.Tensor | None = None  # [B, P]
    input_ids: torch.Tensor | None = None  # [N, L] prompt + completion, right-padded (custom layout)
    gather_index: torch.Tensor | None = None  # [N, T] logit positions of completion tokens (custom layout)
    prompts: list | None = None  # B prompts (VisionPrompt: their pixel inputs) when some have images; shared
    completion_pixels: list | None = None  # [N] pixel inputs of the images tools showed in each completion, or None

    def rows(self, index: slice) -> Batch:
        pick = lambda x: None if x is None else x[index]
        return Batch(
            pick(self.completion_ids),
            pick(self.completion_mask),
            pick(self.group_index),
            self.prompt_ids,
            self.prompt_mask,
            pick(self.input_ids),
            pick(self.gather_index),
            self.prompts,
            pick(self.completion_pixels),
        )

    def __len__(self) -> int:
        return self.completion_ids.size(0)


def build_batch(model: torch.nn.Module, rollouts: Rollouts, pad_token_id: int, device: torch.device) -> Batch:
    completion_ids = rollouts.completion_ids.to(device)  # [N, T]
    completion_mask = rollouts.completion_mask.to(device)  # [N, T]
    group_index = rollouts.group_index.to(device)  # [N]
    if is_hf_model(model):
        prompt_ids, prompt_mask = left_pad(rollouts.prompt_ids, pad_token_id, device)  # [B, P]
        shown = getattr(rollouts, "completion_pixels", None)
        prompts = list(rollouts.prompt_ids) if has_images(rollouts.prompt_ids) or shown else None
        return Batch(
            completion_ids,
            completion_mask,
            group_index,
            prompt_ids,
            prompt_mask,
            prompts=prompts,
            completion_pixels=shown,
        )
    if has_images(rollouts.prompt_ids) or getattr(rollouts, "completion_pixels", None):
        raise ValueError("prompts with images need a Hugging Face vision-language model; this model is a custom one.")
    rows = [rollouts.prompt_ids[g] for g in group_index.tolist()]
    T = completion_ids.size(1)
    width = max(len(p) for p in rows) + T
    input_ids = torch.full((len(rows), width), pad_token_id, dtype=torch.long, device=device)
    gather_index = torch.empty((len(rows), T), dtype=torch.long, device=device)
    for i, p in enumerate(rows):
        input_ids[i, : len(p)] = torch.tensor(p, device=device)
        input_ids[i, len(p) : len(p) + T] = completion_ids[i]
        gather_index[i] = torch.arange(len(p) - 1, len(p) - 1 + T, device=device)  # logits at t predict token t+1
    return Batch(completion_ids, completion_mask, group_index, input_ids=input_ids, gather_index=gather_index)


def data_parallel(model: torch.nn.Module) -> bool:
    """True for DDP and FSDP modules: one plain forward call per micro-batch, through the module's own
    forward (DDP cannot take two forward calls before one backward; FSDP gathers a layer's weights
    inside its forward only, so the fused head could not read the LM head's weight)."""
    from torch.nn.parallel import DistributedDataParallel

    from grpokit.system.processes import is_sharded

    return isinstance(model, DistributedDataParallel) or is_sharded(model)


def shares_prefix(model: torch.nn.Module) -> bool:
    """True when ``model`` can run a prompt once and its completions on the prompt's KV cache."""
    return not data_parallel(model) and is_hf_model(model) and not activation_checkpointing(model)


def fused_head(model: torch.nn.Module, kernels: Kernels) -> tuple[torch.nn.Module, torch.nn.Linear] | None:
    """(decoder, lm_head) when the fused head computes ``model``'s log-probs, else None: DDP and FSDP
    modules (one plain forward call each), or a head that is not plain Linear (:meth:`Kernels.plain_head`)."""
    return None if data_parallel(model) else kernels.plain_head(model)


def _run(model, head, keep: int, kernels: Kernels, **inputs):
    """The last ``keep`` positions' hidden states (``head`` given: ``model`` is the decoder) or logits, and the KV
    cache; under the kernels' attention for small CPU calls (:meth:`Kernels.attention`), their MLPs
    (:meth:`Kernels.mlp`) and norms (:meth:`Kernels.norms`), the same numbers."""
    with kernels.attention(model), kernels.mlp(model), kernels.norms(model):
        if head is not None:
            out = model(**inputs)
            return out.last_hidden_state[:, -keep:], output_cache(out)
        out = model(**inputs, logits_to_keep=keep)
        return out.logits[:, -keep:], output_cache(out)


def completion_features(
    model: torch.nn.Module, head: torch.nn.Linear | None, batch: Batch, width: int, kernels: Kernels
) -> torch.Tensor:
    """Hidden states (``head`` given, ``model`` its decoder) or logits at the positions that predict the
    first ``width`` completion tokens: [n, w, H or V]."""
    ids = batch.completion_ids[:, :width]  # [n, w]
    if batch.prompt_ids is None:
        logits = logits_of(model(batch.input_ids))  # [n, L, V]
        return logits.gather(1, batch.gather_index[:, :width, None].expand(-1, -1, logits.size(-1)))  # [n, w, V]
    if batch.completion_pixels is not None and any(p is not None for p in batch.completion_pixels):
        return _full_forward_with_tool_images(model, head, batch, width, kernels)
    groups, inverse = torch.unique(batch.group_index, return_inverse=True)  # [g], [n]
    prompt_ids, prompt_mask = _trim_left(batch.prompt_ids[groups], batch.prompt_mask[groups])  # [g, P]
    prompt_position = (prompt_mask.cumsum(-1) - 1).clamp(min=0)  # [g, P]
    extra = {}  # a vision-language model's pixel inputs, and its M-RoPE positions [3, g, P]
    if batch.prompts is not None:
        chosen = [batch.prompts[g] for g in groups.tolist()]
        extra = batch_inputs(chosen, prompt_ids.size(1), ids.device)
        prompt_position = prompt_positions(model, prompt_ids, prompt_mask, extra)
    if extra and not shares_prefix(model):  # each row with its prompt's images: the vision tower runs n times
        return _full_forward_with_images(model, head, batch, width, kernels, chosen, prompt_ids, prompt_mask, extra)
    if not shares_prefix(model):
        mask = torch.cat([prompt_mask[inverse], batch.completion_mask[:, :width].long()], dim=1)  # [n, P+w]
        features, _ = _run(
            model,
            head,
            width + 1,
            kernels,
            input_ids=torch.cat([prompt_ids[inverse], ids], dim=1),
            attention_mask=mask,
            position_ids=(mask.cumsum(-1) - 1).clamp(min=0),
            use_cache=False,
        )
        return features[:, :-1]  # [n, w, D]
    first, cache = _run(
        model,
        head,
        1,
        kernels,
        input_ids=prompt_ids,
        attention_mask=prompt_mask,
        position_ids=prompt_position,
        use_cache=True,
        **extra,  # the vision tower runs once per prompt; its G completions read the prompt's cache
    )
    first = first[inverse]  # [n, 1, D]: the prompt's last position predicts completion token 0
    if width == 1:
        return first
    select_rows(cache, inverse)  # [g, ...] -> [n, ...]
    if torch.is_grad_enabled():
        fresh_state_writes(cache)  # Qwen3.5's linear-attention states: no in-place write over a saved tensor
    mask = torch.cat([prompt_mask[inverse], batch.completion_mask[:, : width - 1].long()], dim=1)  # [n, P+w-1]
    position = next_positions(prompt_position, width - 1)[inverse]  # [n, w-1]
    rest, _ = _run(
        model,
        head,
        width - 1,
        kernels,
        input_ids=ids[:, :-1],
        attention_mask=mask,
        position_ids=position,
        **cache_kwargs(model, cache),
        use_cache=True,
    )  # completion token t predicts token t+1
    return torch.cat([first, rest], dim=1)  # [n, w, D]


def _full_forward_with_images(model, head, batch, width, kernels, chosen, prompt_ids, prompt_mask, extra):
    """Features [n, w, D] of a full forward over [prompt | completion] per row, each with its prompt's images (the
    model's own forward over repeated inputs: under DDP, FSDP or activation checkpointing)."""
    inputs = full_forward_image_inputs(model, batch, width, chosen, prompt_ids, prompt_mask, extra)
    features, _ = _run(model, head, width + 1, kernels, use_cache=False, **inputs)
    return features[:, :-1]  # [n, w, D]


def _full_forward_with_tool_images(model, head, batch, width, kernels):
    """Features [n, w, D] of completions some of which hold images a tool showed: one full forward over each row's
    [prompt | completion] with its prompt's pixel inputs then its completion's, positions from the model's own rope
    index over the whole row (M-RoPE jumps after each image: no shared prompt cache, no text positions after it)."""
    index = batch.group_index
    ids = torch.cat([batch.prompt_ids[index], batch.completion_ids[:, :width]], dim=1)  # [n, P+w]
    mask = torch.cat([batch.prompt_mask[index], batch.completion_mask[:, :width].long()], dim=1)  # [n, P+w]
    prompts = [batch.prompts[g] for g in index.tolist()]
    images = [[getattr(p, "pixels", None), c] for p, c in zip(prompts, batch.completion_pixels)]
    inputs = conversation_inputs(model, ids, mask, images)
    features, _ = _run(model, head, width + 1, kernels, use_cache=False, **inputs)
    return features[:, :-1]  # [n, w, D]


def full_forward_image_inputs(model, batch, width, chosen, prompt_ids, prompt_mask, extra=None) -> dict:
    """The inputs of a full forward over [prompt | completion] per row (``input_ids`` [n, P+w], ``attention_mask``,
    ``position_ids`` [n, P+w] or M-RoPE's [3, n, P+w], and each row's prompt's pixel inputs); ``chosen``: the
    prompts of ``prompt_ids``' groups, ``extra``: their batched pixel inputs (built here when not given)."""
    _, inverse = torch.unique(batch.group_index, return_inverse=True)  # [n]
    if extra is None:
        extra = batch_inputs(chosen, prompt_ids.size(1), prompt_ids.device)
    rows = [chosen[i] for i in inverse.tolist()]
    inputs = batch_inputs(rows, prompt_ids.size(1), prompt_ids.device, right=width)
    position = prompt_positions(model, prompt_ids, prompt_mask, extra)[..., inverse, :]  # [n, P] or [3, n, P]
    return {
        "input_ids": torch.cat([prompt_ids[inverse], batch.completion_ids[:, :width]], dim=1),
        "attention_mask": torch.cat([prompt_mask[inverse], batch.completion_mask[:, :width].long()], dim=1),
        "position_ids": with_positions(position, next_positions(position, width)),
        **inputs,
    }


def _trim_left(ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Drop the left-padding columns that every row has (a micro-batch's prompts may all be shorter than the batch's
    longest)."""
    first = int((mask.sum(0) > 0).nonzero()[0]) if mask.any() else 0
    return ids[:, first:], mask[:, first:]


def completion_logprobs(
    model: torch.nn.Module,
    batch: Batch,
    temperature: float,
    with_entropy: bool = False,
    kernels: Kernels | None = None,
):
    """(logprobs [n, T], entropy [n, T] or None) of the completion tokens at ``temperature``.

    With a plain LM head (:func:`fused_head`) the head runs fused with the log-softmax on real
    completion positions only (padding costs nothing, and 0 is returned there); otherwise logits
    are computed up to the micro-batch's longest completion and reduced by ``selective_logprobs``
    (0 past that width). ``kernels``: the run's (default: chosen here for the model's device).
    """
    logprobs, entropy, _ = completion_topk(model, batch, temperature, None, with_entropy, kernels)
    return logprobs, entropy


def completion_topk(
    model: torch.nn.Module,
    batch: Batch,
    temperature: float,
    at: torch.Tensor | None,
    with_entropy: bool = False,
    kernels: Kernels | None = None,
):
    """:func:`completion_logprobs` and, with ``at`` [n, T, k] (ids per completion position, e.g. a teacher's top-k),
    the log-probs [n, T, k] at those ids with their gradient (0 past each completion; None without ``at``).

    Through the fused head no [n, T, V] logits exist: log p(v) = z_v - z_y + log p(y), with z at the k ids and at the
    sampled id y from :func:`grpokit.kernels.gathered_head.gathered_logits` and log p(y) the fused head's (its
    logsumexp is lse = z_y - log p(y)); otherwise log_softmax of the logits, gathered."""
    kernels = kernels if kernels is not None else _default_kernels(model)
    T = batch.completion_ids.size(1)
    width = max(int(batch.completion_mask.sum(1).max()), 1)
    ids = batch.completion_ids[:, :width]  # [n, w]
    found = fused_head(model, kernels)
    picked = None
    if found is not None:
        decoder, head = found
        with kernels.embedding_grad(decoder):
            hidden = completion_features(decoder, head, batch, width, kernels)  # [n, w, H]
        real = batch.completion_mask[:, :width].bool()  # [n, w]
        logprobs, entropy = kernels.head_logprobs(
            hidden[real], head.weight, head.bias, ids[real], temperature, with_entropy
        )  # [m]
        if at is not None:
            picked = _fused_at(hidden[real], head, at[:, :width][real], ids[real], logprobs, temperature)  # [m, k]
            picked = _scatter(real, picked)  # [n, w, k]
        logprobs = _scatter(real, logprobs)  # [n, w]
        if entropy is not None:
            entropy = _scatter(real, entropy)
    else:
        logits = completion_features(model, None, batch, width, kernels)  # [n, w, V]
        logprobs = selective_logprobs(logits, ids, temperature=temperature)  # [n, w]
        if at is not None:
            mask = batch.completion_mask[:, :width, None].float()
            picked = torch.log_softmax(logits.float() / temperature, -1).gather(-1, at[:, :width]) * mask
        entropy = None
        if with_entropy:
            with torch.no_grad():
                entropy = entropy_from_logits(logits.detach(), temperature=temperature)  # [n, w]
    if entropy is not None:
        entropy = F.pad(entropy, (0, T - width))  # [n, T]
    if picked is not None:
        picked = F.pad(picked, (0, 0, 0, T - width))  # [n, T, k]
    return F.pad(logprobs, (0, T - width)), entropy, picked  # [n, T]


def _scatter(real: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """``values`` [m, ...] of the ``real`` [n, w] positions placed into zeros [n, w, ...] (differentiable)."""
    out = torch.zeros((*real.shape, *values.shape[1:]), dtype=torch.float32, device=real.device)
    return out.index_put((real,), values.float())


def _fused_at(hidden, head, at, tokens, logprobs, temperature: float) -> torch.Tensor:
    """[m, k] log p(at) at ``temperature`` from hidden [m, H], the sampled ``tokens`` [m] and their fused-head
    log-probs [m]: z at the k ids and at the token from the gathered head, lse = z_y - log p(y)."""
    from grpokit.kernels.gathered_head import gathered_logits

    z = gathered_logits(hidden, head.weight, head.bias, torch.cat([at, tokens[:, None]], dim=1)) / temperature
    return z[:, :-1] - z[:, -1:] + logprobs.float()[:, None]


def batched_logprobs(
    model: torch.nn.Module, batch: Batch, temperature: float, micro_batch_size: int, kernels: Kernels | None = None
) -> torch.Tensor:
    """Log-probs [N, T] without grad, chunk by chunk (reference and old-policy passes).

    Chunks are ``micro_batch_size`` rows, or more through the fused head, which holds no [rows, T, V]
    logits: up to ``NO_GRAD_POSITIONS`` completion positions (bigger matmuls, fewer per-chunk costs).
    Runs in inference mode (no autograd bookkeeping at all; no_grad for an FSDP module); the result
    is cloned out of it so it can meet the policy's graph in the loss.
    """
    kernels = kernels if kernels is not None else _default_kernels(model)
    rows = micro_batch_size
    if fused_head(model, kernels) is not None:
        rows = max(rows, NO_GRAD_POSITIONS // max(batch.completion_ids.size(1), 1))
    from grpokit.system.processes import is_sharded

    # FSDP sets up a module's gathered and sharded parameters on its first forward: inside inference
    # mode they would become inference tensors, which the reference resync could not update in place.
    with torch.no_grad() if is_sharded(model) else torch.inference_mode():
        out = torch.cat(
            [
                completion_logprobs(model, batch.rows(slice(i, i + rows)), temperature, kernels=kernels)[0].float()
                for i in range(0, len(batch), rows)
            ]
        )
    return out.clone()


def _default_kernels(model: torch.nn.Module) -> Kernels:
    """Kernels for a caller that passes none: chosen for the model's device, computing in its weights' dtype."""
    return Kernels.select(next(model.parameters()).device)
