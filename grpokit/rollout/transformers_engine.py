"""Sampling with transformers' own ``model.generate``: for generation options grpokit's sampler cannot honour.

grpokit's sampler (:class:`grpokit.rollout.engine.HFRolloutEngine`) draws one token at a time per row, which covers
temperature, top-k/p, min-p and the logits processors of :mod:`grpokit.rollout.logits_rules`. TRL passes
``generation_kwargs`` to transformers' ``GenerationConfig``, so a TRL script may ask for what only ``generate``
does: beam search (``num_beams``, ``length_penalty``), ``typical_p``, ``epsilon_cutoff``, ``sequence_bias`` ...
This engine (``generation.engine: transformers``, chosen by the config when such keys are given) runs
``generate`` with them, as TRL does, on the policy's own weights.

Its log-probs are what the learner computes: log softmax(logits / temperature) of the policy at each sampled token,
taken by one forward pass over the finished rows (beam search has no per-token sampling probability of its own).

Prompts with images (:class:`grpokit.models.vision_inputs.VisionPrompt`) are passed as TRL passes them: each prompt
repeated G times, the rows' processor inputs batched with them (``pixel_values`` of every row, ``image_grid_thw``,
``mm_token_type_ids`` left-padded), so a patched or custom ``generate`` sees TRL's batch; the image placeholder
tokens are never sampled, as in grpokit's sampler.
"""

from __future__ import annotations

import dataclasses

import torch

from grpokit.machine.hardware import autocast
from grpokit.models.vision_inputs import (
    batch_inputs,
    has_images,
    keep,
    next_positions,
    placeholder_ids,
    prompt_positions,
    with_positions,
)
from grpokit.rollout.engine import SharedWeightsEngine, left_pad
from grpokit.rollout.types import Rollouts, SamplingParams


class TransformersRolloutEngine(SharedWeightsEngine):
    """Samples ``num_generations`` completions per prompt with ``model.generate`` (a transformers causal LM); its
    ``generator`` (on the CPU) seeds each generate call, which draws from torch's global RNG."""

    @torch.no_grad()
    def generate(self, prompt_ids: list[list[int]], num_generations: int, params: SamplingParams) -> Rollouts:
        was_training = self.model.training
        self.model.eval()
        try:
            rows = [p for p in prompt_ids for _ in range(num_generations)]  # TRL's layout: each prompt G times
            ids, mask = left_pad(rows, self.pad_token_id, self.device)  # [N, P]
            extra = batch_inputs(rows, ids.size(1), self.device) if has_images(rows) else {}
            if extra:  # image placeholders are never sampled (the learner could not run such a completion)
                suppress = tuple(sorted({*params.suppress_tokens, *placeholder_ids(self.model)}))
                params = dataclasses.replace(params, suppress_tokens=suppress)
            seed = int(torch.randint(0, 2**62, (1,), generator=self.generator, device=self.generator.device))
            with torch.random.fork_rng(devices=[]), autocast(self.device, self.autocast_dtype):
                torch.manual_seed(seed)  # generate draws from the global RNG: one seed per call, from this stream
                sequences = self.model.generate(
                    input_ids=ids, attention_mask=mask, **extra, generation_config=self.generation_config(params)
                )
                completions, lengths, stopped = self._completions(sequences[:, ids.size(1) :], params)
                logprobs = self._logprobs(ids, mask, completions, params.temperature, rows if extra else None)
        finally:
            self.model.train(was_training)
        completion_mask = (torch.arange(completions.size(1))[None, :] < lengths[:, None]).float()  # [N, T]
        return Rollouts(
            prompt_ids=[keep(p) for p in prompt_ids],  # a VisionPrompt keeps its images
            completion_ids=completions.cpu(),
            completion_mask=completion_mask,
            logprobs=logprobs.cpu() * completion_mask,
            finish_reasons=["stop" if s else "length" for s in stopped.tolist()],
            num_generations=num_generations,
            policy_version=self.policy_version,
        )

    def generation_config(self, params: SamplingParams):
        """transformers' GenerationConfig for ``params``: its sampling fields, then ``params.transformers_kwargs``
        (TRL's generation_kwargs that only generate honours), which transformers itself checks."""
        from transformers import GenerationConfig

        options = {
            "max_new_tokens": params.max_completion_length,
            "do_sample": not params.greedy,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "top_k": params.top_k or None,
            "min_p": params.min_p or None,
            "repetition_penalty": params.repetition_penalty,
            "no_repeat_ngram_size": params.no_repeat_ngram_size,
            "min_new_tokens": params.min_new_tokens or None,
            "suppress_tokens": list(params.suppress_tokens) or None,
            "begin_suppress_tokens": list(params.begin_suppress_tokens) or None,
            "bad_words_ids": [list(w) for w in params.bad_words_ids] or None,
            "eos_token_id": self.eos_token_ids,
            "pad_token_id": self.pad_token_id,
            **params.transformers_kwargs,
        }
        return GenerationConfig(**options)

    def _completions(self, generated: torch.Tensor, params: SamplingParams):
        """(tokens [N, T] padded after each row's EOS, lengths [N], stopped [N]) of ``generate``'s new tokens."""
        is_eos = torch.isin(generated, torch.tensor(self.eos_token_ids, device=generated.device))  # [N, T']
        stopped = is_eos.any(dim=1)  # [N]
        lengths = torch.where(stopped, is_eos.int().argmax(dim=1) + 1, generated.size(1))  # [N]
        width = max(int(lengths.max()), 1) if generated.size(1) else 1
        tokens = torch.full((generated.size(0), width), self.pad_token_id, dtype=torch.long)
        tokens[:, : generated.size(1)] = generated[:, :width].cpu()
        keep = torch.arange(width)[None, :] < lengths.cpu()[:, None]
        return tokens.masked_fill(~keep, self.pad_token_id), lengths.cpu(), stopped.cpu()

    def _logprobs(self, ids, mask, completions: torch.Tensor, temperature: float, rows: list | None = None):
        """[N, T] log softmax(logits / temperature) of the policy at each completion token: one forward pass over
        prompt + completion, keeping only the completion's logits. ``rows``: the N prompts when they carry images
        (their pixel inputs and multimodal positions go with the pass), else None."""
        T = completions.size(1)
        full = torch.cat([ids, completions.to(ids.device)], dim=1)  # [N, P+T]
        full_mask = torch.cat([mask, torch.ones_like(completions, device=mask.device)], dim=1)  # [N, P+T]
        extra = {} if rows is None else batch_inputs(rows, ids.size(1), ids.device, right=T)
        if extra:  # M-RoPE's [3, N, P] prompt positions (from the images' grids), then text on every axis
            prompt = prompt_positions(self.model, ids, mask, extra)
            position = with_positions(prompt, next_positions(prompt, T))  # [3, N, P+T] or [N, P+T]
        else:
            position = (full_mask.cumsum(-1) - 1).clamp(min=0)  # [N, P+T]: left padding does not shift positions
        out = self.model(input_ids=full, attention_mask=full_mask, position_ids=position, logits_to_keep=T + 1, **extra)
        logits = out.logits[:, :-1].float() / temperature  # [N, T, V]: position t predicts completion token t
        return torch.log_softmax(logits, dim=-1).gather(-1, completions.to(ids.device)[..., None]).squeeze(-1)
