"""grpokit's own sampling loop: G completions per prompt with a shared-prefix KV cache.

Hugging Face models: the B prompts are left-padded and prefilled once, the KV cache is repeated G
times (the prompt is computed once per group, not G times), then tokens are decoded one at a time
into a cache allocated once for the whole completion. Rows that reach EOS leave the batch, so late
steps only pay for the sequences still running.

The fast paths come from the run's :class:`grpokit.kernels.Kernels`: decoding steps of Llama-family
models (Llama, Qwen2, Qwen3, Mistral; LoRA merged) run through a fused decoder (weights fused and
prepared once per call, four matmuls per layer). Other HF models decode through their own forward:
with ``autocast_dtype`` (bf16 on CPUs with native bf16 matmul) the whole generation runs in one
autocast region, so each weight is cast once per call rather than once per decoded token; in
float32 on CPU their Linear weights are packed once per call for oneDNN instead, which the few-row
matmuls of decoding run faster on. An FSDP-sharded model (torchrun, ``strategy: fsdp``) always decodes through its
own forward, neither fused nor packed (both copy the weights); the caller's ``procs.lockstep`` block keeps the
ranks' forward calls in step (:class:`grpokit.distributed.fsdp.Lockstep`).

Custom models (``forward(input_ids) -> logits``): no cache and no attention mask are assumed, so
each group (whose G rows share one prompt length, hence need no padding) is decoded with full
forward passes.
"""

from __future__ import annotations

import dataclasses
from contextlib import nullcontext
from typing import Protocol

import torch

from grpokit.kernels import Kernels
from grpokit.machine.hardware import autocast
from grpokit.models.cache_rows import repeat_rows, select_rows
from grpokit.models.kv_cache_arg import cache_kwargs, output_cache
from grpokit.models.loading import is_hf_model, logits_of
from grpokit.models.vision_inputs import (
    batch_inputs,
    has_images,
    keep,
    next_positions,
    placeholder_ids,
    prompt_positions,
)
from grpokit.rollout.logits_rules import logits_rules
from grpokit.rollout.next_token import sample_next
from grpokit.rollout.types import Rollouts, SamplingParams


class RolloutEngine(Protocol):
    """What every rollout engine provides (the engines by name: :mod:`grpokit.rollout.engines`).

    ``generate``: ``num_generations`` completions of each prompt as :class:`Rollouts` stamped with
    ``policy_version``, the optimizer steps of the weights it samples from. ``sync_weights()``: the learner has
    changed the policy's weights (one version more); the engine samples from them from the next ``generate`` on
    (a colocated engine shares them; one with its own copy reloads it before sampling). ``takes_group_seeds``:
    ``generate(..., seeds=)`` takes one seed per prompt and samples each group from it (else
    :func:`grpokit.rollout.seeding.generate_per_group` reseeds ``generator`` before each group). ``generator``:
    the engine's random stream (saved in checkpoints); ``pad_token_id``: the right padding of its completions.
    ``takes_raw_prompts``: ``generate`` takes the prompts as the dataset holds them (strings or chat messages: the
    rollout_func engine), not their token ids.
    """

    takes_group_seeds: bool
    takes_raw_prompts: bool
    policy_version: int
    generator: torch.Generator
    pad_token_id: int

    def generate(self, prompt_ids: list[list[int]], num_generations: int, params: SamplingParams) -> Rollouts: ...

    def sync_weights(self) -> None: ...


def left_pad(seqs: list[list[int]], pad_id: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded ids [B, P] and attention mask [B, P] for a list of token id lists."""
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        if s:
            ids[i, width - len(s) :] = torch.tensor(s)
            mask[i, width - len(s) :] = 1
    return ids.to(device), mask.to(device)


class SharedWeightsEngine:
    """An engine that samples from the policy's own weights in this process: each update moves it one
    ``policy_version`` on (``sync_weights``) with nothing to copy. Seeds its own ``generator`` from ``seed``."""

    takes_group_seeds = False  # one random stream: generate_per_group reseeds it group by group
    takes_raw_prompts = False

    def __init__(
        self,
        model: torch.nn.Module,
        eos_token_ids: list[int],
        pad_token_id: int,
        device: torch.device,
        seed: int = 0,
        autocast_dtype: torch.dtype | None = None,
    ):
        self.model = model
        self.eos_token_ids = sorted(set(eos_token_ids))
        self.pad_token_id = pad_token_id
        self.device = device
        self.autocast_dtype = autocast_dtype
        self.generator = torch.Generator().manual_seed(seed)
        self.policy_version = 0

    def sync_weights(self) -> None:
        """The policy was updated: the engine samples from the same (shared) weights, one version on."""
        self.policy_version += 1


class HFRolloutEngine(SharedWeightsEngine):
    """Samples from a local policy model (HF causal LM or a custom logits module), sharing its weights."""

    def __init__(self, *args, kernels: Kernels | None = None, **kwargs):
        """Arguments as :class:`SharedWeightsEngine`'s; ``kernels``: the run's choice of kernels (default: chosen here
        for ``device`` and ``autocast_dtype``)."""
        super().__init__(*args, **kwargs)
        self.kernels = kernels if kernels is not None else Kernels.select(self.device, self.autocast_dtype)
        self.eos_token_ids = torch.tensor(self.eos_token_ids, device=self.device)
        self.generator = torch.Generator(device=self.device).manual_seed(self.generator.initial_seed())
        # another engine that samples in its place, from its stream and at its version: transformers' generate for
        # a GRPOTrainer whose model's generate was replaced (grpokit.compose.patched_generate); None: this one
        self.generate_with = None

    @torch.no_grad()  # not inference_mode: its tensors could not enter the autograd graph of the update
    def generate(self, prompt_ids: list[list[int]], num_generations: int, params: SamplingParams) -> Rollouts:
        if self.generate_with is not None:
            return self.generate_with.generate(prompt_ids, num_generations, params)
        was_training = self.model.training
        self.model.eval()
        try:
            rows = len(prompt_ids) * num_generations
            dtype = self.autocast_dtype or next(self.model.parameters()).dtype
            decoder = self.kernels.decoder(self.model, dtype, rows)
            # the fused decoder packs its own weights; other models' Linear layers are packed where the kernels say
            packed = self.kernels.sampling_linears(self.model, rows, self.device) if decoder is None else nullcontext()
            with autocast(self.device, self.autocast_dtype), packed:
                if decoder is not None:
                    tokens, logprobs, lengths, stopped = self._generate_cached(
                        prompt_ids, num_generations, params, decoder
                    )
                else:
                    tokens, logprobs, lengths, stopped = self._generate(prompt_ids, num_generations, params)
        finally:
            self.model.train(was_training)
        width = max(int(lengths.max()), 1)
        completion_mask = (torch.arange(width, device=lengths.device)[None, :] < lengths[:, None]).float()  # [N, T]
        return Rollouts(
            prompt_ids=[keep(p) for p in prompt_ids],  # a VisionPrompt keeps its images
            completion_ids=tokens[:, :width].cpu(),
            completion_mask=completion_mask.cpu(),
            logprobs=(logprobs[:, :width] * completion_mask).cpu(),
            finish_reasons=["stop" if s else "length" for s in stopped.tolist()],
            num_generations=num_generations,
            policy_version=self.policy_version,
        )

    def _generate(self, prompt_ids, G, params):
        """tokens [N, T], logprobs [N, T], lengths [N], stopped [N] for the prompts' groups."""
        if is_hf_model(self.model):
            return self._generate_cached(prompt_ids, G, params)
        if has_images(prompt_ids):
            raise ValueError(
                "prompts with images need a Hugging Face vision-language model; this model is a custom one."
            )
        parts = [self._generate_plain(p, G, params) for p in prompt_ids]
        return tuple(torch.cat(x) for x in zip(*parts))

    def _generate_cached(self, prompt_ids, G, params, decoder=None):
        """Shared-prefix decoding for HF models; returns tokens [N, T], logprobs [N, T], lengths [N], stopped [N].
        With ``decoder`` (a fused decoder), the decoding steps run through it instead of the model's forward."""
        ids, mask = left_pad(prompt_ids, self.pad_token_id, self.device)  # [B, P]
        # a vision-language model's prompts bring their pixel inputs; its positions may be M-RoPE's [3, B, P]
        extra = batch_inputs(prompt_ids, ids.size(1), self.device) if has_images(prompt_ids) else {}
        position = prompt_positions(self.model, ids, mask, extra)  # [B, P] or [3, B, P]
        if extra:  # image placeholders are never sampled: the model's forward would take them for image slots
            suppress = tuple(sorted({*params.suppress_tokens, *placeholder_ids(self.model)}))
            params = dataclasses.replace(params, suppress_tokens=suppress)
        out = self.model(
            input_ids=ids, attention_mask=mask, position_ids=position, use_cache=True, logits_to_keep=1, **extra
        )
        N, P, T = ids.size(0) * G, ids.size(1), params.max_completion_length
        cache = output_cache(out)
        repeat_rows(cache, G)  # [B, ...] -> [N, ...]: one prefill per group
        self.kernels.preallocate(cache, P + T)
        logits = out.logits[:, -1].repeat_interleave(G, dim=0)  # [N, V]
        # the attention mask of every step is a prefix of one [N, P+T] mask, built once
        mask = torch.cat([mask, mask.new_ones(ids.size(0), T)], dim=1).repeat_interleave(G, dim=0)  # [N, P+T]
        if decoder is not None or self._prepared_step_mask():
            mask = mask.bool()[:, None, None, :]  # [N, 1, 1, P+T]
        position = next_positions(position, 1).repeat_interleave(G, dim=0)  # [N, 1]

        tokens = torch.full((N, T), self.pad_token_id, dtype=torch.long, device=self.device)
        logprobs = torch.zeros((N, T), dtype=torch.float32, device=self.device)
        lengths = torch.full((N,), T, dtype=torch.long, device=self.device)
        stopped = torch.zeros(N, dtype=torch.bool, device=self.device)
        active = torch.arange(N, device=self.device)  # rows still decoding
        histories = [p for p in prompt_ids for _ in range(G)]  # row n's context: its prompt, then what it samples
        rules = logits_rules(params, histories, self.eos_token_ids.tolist(), logits.size(-1), self.device)
        for t in range(T):
            processed = None if rules is None else rules.apply(logits, active, t)  # [A, V]
            token, logprob = sample_next(logits, params, self.generator, processed)  # [A], [A]
            if rules is not None:
                rules.append(active, token)
            tokens[active, t] = token
            logprobs[active, t] = logprob
            done = torch.isin(token, self.eos_token_ids)  # [A]
            if done.any():
                lengths[active[done]] = t + 1
                stopped[active[done]] = True
                keep = (~done).nonzero().squeeze(-1)  # [A']
                if keep.numel() == 0:
                    break
                active, token, mask, position = active[keep], token[keep], mask[keep], position[keep]
                select_rows(cache, keep)
            if t == T - 1:
                break
            if decoder is not None:
                logits = decoder.step(token, position, mask[..., : P + t + 1], cache)  # [A, V]
            else:
                out = self.model(
                    input_ids=token[:, None],
                    attention_mask=mask[..., : P + t + 1],
                    position_ids=position,
                    **cache_kwargs(self.model, cache),
                    use_cache=True,
                )
                logits = out.logits[:, -1]  # [A, V]
            position = position + 1
        return tokens, logprobs, lengths, stopped

    def _prepared_step_mask(self) -> bool:
        """Whether decoding steps get a prepared 4D mask instead of the 2D padding mask.

        Given an all-ones 2D mask for a one-token step, HF drops it and calls SDPA with enable_gqa,
        which on CPU is much slower than the grouped-query layout HF uses when a mask is present
        (docs/performance.md). A 4D boolean mask (True = attend, HF's own SDPA format) is passed
        through as is and keeps that layout.
        """
        config = getattr(self.model, "config", None)
        if _has_sliding_window(config):  # HF passes a 4D mask to every layer as is: a window's cache is shorter
            return False
        return self.device.type == "cpu" and getattr(config, "_attn_implementation", None) == "sdpa"

    def _generate_plain(self, prompt: list[int], G: int, params: SamplingParams):
        """Full-forward decoding of one group for models without a KV cache."""
        T = params.max_completion_length
        seq = torch.tensor(prompt, device=self.device).repeat(G, 1)  # [G, P]
        tokens = torch.full((G, T), self.pad_token_id, dtype=torch.long, device=self.device)
        logprobs = torch.zeros((G, T), dtype=torch.float32, device=self.device)
        lengths = torch.full((G,), T, dtype=torch.long, device=self.device)
        stopped = torch.zeros(G, dtype=torch.bool, device=self.device)
        rules, rows = None, torch.arange(G, device=self.device)
        for t in range(T):
            logits = logits_of(self.model(seq))[:, -1]  # [G, V]
            if t == 0:
                rules = logits_rules(params, [prompt] * G, self.eos_token_ids.tolist(), logits.size(-1), self.device)
            processed = None if rules is None else rules.apply(logits, rows, t)  # [G, V]
            token, logprob = sample_next(logits, params, self.generator, processed)  # [G]
            if rules is not None:
                rules.append(rows, token)
            running = ~stopped
            tokens[running, t] = token[running]
            logprobs[running, t] = logprob[running]
            done = running & torch.isin(token, self.eos_token_ids)
            lengths[done] = t + 1
            stopped |= done
            if stopped.all():
                break
            seq = torch.cat([seq, token[:, None]], dim=1)  # [G, P+t+1]
        return tokens, logprobs, lengths, stopped


def _has_sliding_window(config) -> bool:
    """Whether a model's decoder has sliding-window layers (Gemma 2 and 3, Mistral): their KV cache keeps only the
    window, so a decoding step's mask must be the 2D padding mask HF cuts per layer, not a prepared 4D one."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    types = getattr(text, "layer_types", None)
    if types is not None:
        return "sliding_attention" in types
    return getattr(text, "sliding_window", None) is not None
